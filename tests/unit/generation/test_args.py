"""minitf.generation.args: what generation is given, checked; a wrong type is one line naming the argument."""

import pytest

import minitf

# Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
# naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...').


def test_generate_called_with_the_wrong_types(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    usage = "(model, tokenizer, prompt, settings=None, **settings)"
    cases = [
        (
            lambda: minitf.generate(model, tok, 123),
            f"generate(): prompt must be text (a str), got int 123; generate{usage}",
        ),
        (
            lambda: minitf.generate(model, tok, b"Romeo"),
            f"generate(): prompt must be text (a str), got bytes b'Romeo' (decode bytes first); generate{usage}",
        ),
        (
            lambda: minitf.generate(tok, model, "Romeo"),
            f"generate(): model must be a minitf Transformer (from minitf.load_run), got Tokenizer; generate{usage}",
        ),
        (
            lambda: minitf.generate(model, "Romeo", tok),
            "generate(): tokenizer must be a minitf Tokenizer (from minitf.load_run), got str 'Romeo'; "
            f"generate{usage}",
        ),
        (
            lambda: minitf.generate(model, tok, "Romeo", {"temperature": 0}),
            "settings must be a minitf SampleConfig or None, got dict (SampleConfig(**d), or the settings as "
            "keyword arguments)",
        ),
        (
            lambda: minitf.generate(model, tok, "Romeo", stop=5),
            "generate(): stop must be a str or a list of str, got int 5",
        ),
        (
            lambda: minitf.generate(model, tok, "Romeo", num_samples="2"),
            "generate(): num_samples must be an int, got str '2'",
        ),
        (
            lambda: list(minitf.stream(model, tok, 123)),
            f"stream(): prompt must be text (a str), got int 123; stream{usage}",
        ),
        (
            lambda: list(minitf.stream_tokens(tok, model, "Romeo")),
            "stream_tokens(): model must be a minitf Transformer (from minitf.load_run), got Tokenizer; "
            f"stream_tokens{usage}",
        ),
    ]
    for call, message in cases:
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value) == message
    assert minitf.generate(model, tok, "Romeo", minitf.SampleConfig(max_new_tokens=3, seed=0)) == minitf.generate(
        model, tok, "Romeo", max_new_tokens=3, seed=0
    )
