"""minitf.web.serve's engine, in process: a completion's n beyond memory is a 400 naming n."""

import pytest

from minitf.web.serve import APIError, Completions

# The OpenAI-compatible server, spoken to by the official `openai` client over 127.0.0.1: its
# completions are minitf.generate's, its logprobs the model's own, its errors the client's own
# exception types; slow clients and closed connections are handled (observed through the server's
# hooks and logs, never through timings).


def test_n_beyond_memory_is_a_400_naming_n(tiny_run, monkeypatch):
    import importlib

    api = Completions(tiny_run)
    module = importlib.import_module("minitf.system.sizes")
    monkeypatch.setattr(module, "physical_memory", lambda: module.sample_row_bytes(api.model) * 3)
    assert api.parse({"model": api.name, "prompt": "O", "n": 3}).n == 3
    with pytest.raises(APIError) as e:
        api.parse({"model": api.name, "prompt": "O", "n": 4})
    assert e.value.status == 400 and e.value.param == "n" and str(e.value).startswith("n=4 needs ")
    assert str(e.value).endswith("ask for at most 3")
