"""The explorer in a real browser: headless Chromium (Debian's chromium and chromium-driver)
driven by Selenium types a prompt, generates, opens a token's attention and each of its other views
(next token, logit lens, positions), checks what they show against the API, and saves screenshots.
Skipped, with the reason, where Chromium, its driver or Selenium is missing (.ci/run installs them).

The screenshots in docs/ are these tests' own: MINITF_EXPLORE_RUN=runs/shakespeare points the
views' test at a trained run instead of the tiny one, and MINITF_EXPLORE_SHOTS=docs saves its
screenshots there as well as in the test's temporary directory."""

import os
import shutil
import threading
from pathlib import Path

import pytest

import minitf
from minitf.generate import generate_tokens, sample_settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="Chromium or chromedriver is not installed (apt-get install chromium chromium-driver)",
)

# pixels of a canvas that are not white, and of the mask's grey (#d0d7de), counted in the page
PIXELS = """const c = arguments[0], d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let ink = 0, grey = 0;
for (let i = 0; i < d.length; i += 4) {
  if (d[i + 3] && (d[i] < 250 || d[i + 1] < 250 || d[i + 2] < 250)) ink++;
  if (d[i] === 208 && d[i + 1] === 215 && d[i + 2] === 222) grey++;
}
return [ink, grey];"""
# the next-token table's rows after the header: each row's cell texts and its class
NEXT_ROWS = """return [...document.querySelectorAll('#n-table tr')].slice(1).map(
  tr => [[...tr.querySelectorAll('td')].map(td => td.innerText.trim()), tr.className]);"""


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1500"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # the driver named explicitly: Selenium Manager would try to download one
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def test_generate_then_open_a_tokens_attention(browser, explore_server, tiny_run, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d, wait = browser, WebDriverWait(browser, 15)
    find, find_all = (
        (lambda css: d.find_element(By.CSS_SELECTOR, css)),
        (lambda css: d.find_elements(By.CSS_SELECTOR, css)),
    )
    d.get(explore_server.url)
    wait.until(lambda _: find("#run-name").text == tiny_run.name)
    assert "step 30" in find("#run-info").text and find_all("#loss polyline")
    assert "30 steps, lr" in find("#run-info").text  # the budget that ended the run
    assert len(find_all("#loss circle")) == 4  # two evaluations of train and val loss, each a dot
    for css, value in (("#prompt", "ROMEO: O"), ("#max_new_tokens", "40"), ("#seed", "5"), ("#temperature", "1")):
        find(css).clear()
        find(css).send_keys(value)
    find("#go").click()
    wait.until(lambda _: "tokens," in find("#status").text)

    model, tok, cfg = minitf.load_run(tiny_run)  # the page shows exactly the library's tokens
    s = sample_settings(cfg.sample, max_new_tokens=40, seed=5, temperature=1.0)
    ids = [int(i) for i in generate_tokens(model, tok.encode("ROMEO: O"), s)]
    prompt, shown = tok.encode("ROMEO: O"), d.execute_script("return state.ids")
    assert shown[: len(prompt)] == prompt and shown[len(prompt) :] == ids[: len(shown) - len(prompt)]
    generated = find_all("#tokens .tok.gen")
    assert len(generated) == len(shown) - len(prompt) >= 3

    d.execute_script("arguments[0].dispatchEvent(new MouseEvent('mouseenter'))", generated[1])
    assert find("#tip").is_displayed() and len(find_all("#tip tr")) == 5  # the top-5

    generated[1].click()
    n = cfg.model.n_layer * cfg.model.n_head
    wait.until(lambda _: len(find_all("#grid canvas")) == n)
    assert all(d.execute_script(PIXELS, c)[0] > 0 for c in find_all("#grid canvas"))
    find_all("#grid canvas")[n - 1].click()  # the last layer's last head
    last = f"Layer {cfg.model.n_layer - 1}, head {cfg.model.n_head - 1}"
    wait.until(lambda _: find("#head-title").text.startswith(last))
    ink, grey = d.execute_script(PIXELS, find("#heatmap"))
    assert ink > 1000 and grey > 100  # weights drawn, the causal mask visible
    query = len(prompt) + 1
    rows = find_all("#steps tr")  # header, a key per row up to the query, the masked later keys, the sum
    assert len(rows) == 1 + (query + 1) + 1 + 1
    assert rows[-1].find_elements(By.TAG_NAME, "td")[4].text == "1.000"  # the weights sum to 1

    # past block_size (32 here) the page shows the window of the model: the last token, then a head
    assert len(shown) > cfg.model.block_size
    generated[-1].click()
    wait.until(lambda _: "the model's window" in find("#window").text)
    find_all("#grid canvas")[0].click()
    wait.until(lambda _: find("#head-title").text.startswith("Layer 0, head 0"))
    assert not find("#error").is_displayed() and find_all("#tokens .tok.query") == [generated[-1]]
    shot = tmp_path / "explore.png"
    assert d.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


@pytest.fixture(scope="module")
def views_server(explore_server):
    """The tiny run's explorer, or one over MINITF_EXPLORE_RUN (a trained run, for the screenshots in docs/)."""
    run = os.environ.get("MINITF_EXPLORE_RUN")
    if not run:
        yield explore_server
        return
    from minitf.web.explore import Explorer, ExploreServer

    srv = ExploreServer(Explorer(run), "127.0.0.1", 0, log=lambda msg: None)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.close()
    thread.join(5)


def save(d, tmp_path, name: str) -> None:
    shot = tmp_path / name
    assert d.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
    if os.environ.get("MINITF_EXPLORE_SHOTS"):
        shutil.copy(shot, Path(os.environ["MINITF_EXPLORE_SHOTS"]) / name)


def percent(text: str) -> float:
    return float(text.rstrip("%")) / 100


def test_a_tokens_next_token_logit_lens_and_positions(browser, views_server, tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    d, wait, ex = browser, WebDriverWait(browser, 30), views_server.explorer
    find, find_all = (
        (lambda css: d.find_element(By.CSS_SELECTOR, css)),
        (lambda css: d.find_elements(By.CSS_SELECTOR, css)),
    )
    d.get(views_server.url)
    wait.until(lambda _: find("#run-name").text == ex.run_dir.name)
    settings = (("#prompt", "ROMEO:\nBut soft, what light"), ("#max_new_tokens", "24"), ("#seed", "7"))
    for css, value in (*settings, ("#temperature", "0.8"), ("#top_k", "50"), ("#top_p", "")):
        find(css).clear()
        find(css).send_keys(value)
    find("#go").click()
    wait.until(lambda _: "tokens," in find("#status").text)
    ids = d.execute_script("return state.ids")
    generated = find_all("#tokens .tok.gen")
    position = len(ids) - len(generated) - 1  # the prompt's last token: what follows it was sampled
    find_all("#tokens .tok")[position].click()
    wait.until(lambda _: find_all("#grid canvas"))
    assert [t.get_attribute("data-index") for t in find_all("#tokens .tok.query")] == [str(position)]

    # next token: the page shows the API's distribution for the settings of its sliders
    def next_rows(with_class: bool = False):
        """The table's cells as the page shows them (innerText), and each row's class, read in one
        script: a WebDriver round trip per cell made this test spend most of its time reading."""
        rows = d.execute_script(NEXT_ROWS)
        return rows if with_class else [cells for cells, _ in rows]

    def check(want):
        rows = next_rows(with_class=True)
        assert [r[1].split(" ← ")[0] for r, _ in rows] == [t["label"] for t in want["tokens"]]
        for (r, cls), t in zip(rows, want["tokens"]):
            assert int(r[0]) == t["rank"] and abs(percent(r[3]) - t["model"]) < 6e-4
            assert ("cut" in cls) == (not t["kept"])
            assert r[4].startswith("cut: ") if not t["kept"] else abs(percent(r[4]) - t["prob"]) < 6e-4
        assert f"{want['kept']:,} of {want['vocab']:,} tokens can be drawn" in find("#n-summary").text

    def shows(rules: dict):
        """Wait for the page to show the API's answer for these settings (a slider's moves come in one by one)."""
        want = ex.distribution({"ids": ids, "position": position, "top": 20, **rules})

        def done(_):
            try:
                check(want)
                return True
            except (AssertionError, ValueError, StaleElementReferenceException):
                return False

        try:
            wait.until(done)
        finally:
            check(want)
        return want

    find('.tabs button[data-view="next"]').click()
    wait.until(lambda _: find("#next").is_displayed() and not find("#attention").is_displayed())
    # the sliders start at the settings the text was generated with
    assert (
        find("#n-temperature-v").text == "0.8" and find("#n-top_k-v").text == "50" and find("#n-top_p-v").text == "off"
    )
    rules = {"temperature": 0.8, "top_k": 50, "top_p": None, "repetition_penalty": 1.0}
    start = shows(rules)
    assert start["kept"] == min(50, start["vocab"])

    def move(name: str, key, times: int = 1, **changed):
        """Press a key on a slider, as a person would, and wait for the page to show the new distribution."""
        for _ in range(times):
            find(f"#n-{name}").send_keys(key)
        rules.update(changed)
        return shows(rules)

    flatter = move("temperature", Keys.ARROW_RIGHT, 4, temperature=1.0)
    sharper = move("temperature", Keys.ARROW_LEFT, 8, temperature=0.6)
    assert sharper["entropy"]["tempered"] < start["entropy"]["tempered"] < flatter["entropy"]["tempered"]
    wide = move("top_k", Keys.HOME, top_k=None)  # top-k 0: off
    assert find("#n-top_k-v").text == "off" and wide["kept"] == wide["vocab"] and not find_all("#n-table tr.cut")
    nucleus = move("top_p", Keys.ARROW_LEFT, 10, top_p=0.5)
    assert find("#n-top_p-v").text == "0.5" and 0 < nucleus["kept"] < nucleus["vocab"]
    assert all(r[4] == "cut: top-p" for r in next_rows() if r[4].startswith("cut"))
    both = move("top_k", Keys.ARROW_RIGHT, 3, top_k=3)
    # a confident model's nucleus may keep fewer than 3 tokens, and then the distribution is the same
    # at every step of the slider: wait for the slider's own value before reading the cut labels
    wait.until(lambda _: find("#n-top_k-v").text == "3")
    below = ["cut: top-k"] * (len(both["tokens"]) - 3)
    wait.until(lambda _: [r[4] for r in next_rows()][3:] == below)
    assert both["kept"] <= 3
    move("top_p", Keys.END, top_p=None)  # top-p 1: off
    ten = move("top_k", Keys.ARROW_RIGHT, 7, top_k=10)
    assert ten["kept"] == 10 and [r[4] for r in next_rows()][10:] == ["cut: top-k"] * (len(ten["tokens"]) - 10)
    assert ten["next"]["id"] == ids[position + 1]  # the token generation drew here
    save(d, tmp_path, "explore-next.png")

    # logit lens: a row per point of the residual stream; the last is the model's own prediction
    find('.tabs button[data-view="lens"]').click()
    L = ex.cfg.model.n_layer
    wait.until(lambda _: len(find_all("#lens-table tr")) == 1 + L + 1)
    lens = ex.lens({"ids": ids, "position": position})
    rows = find_all("#lens-table tr")[1:]
    assert [r.find_element(By.TAG_NAME, "th").text for r in rows] == [
        "embeddings",
        *(f"block {i}" for i in range(L - 1)),
        f"block {L - 1}: the output",
    ]
    for r, layer in zip(rows, lens["layers"]):
        cells = r.find_elements(By.CSS_SELECTOR, "td.tok-cell .lbl")
        assert [c.text for c in cells] == [t["label"] for t in layer["top"]]
    assert [t["id"] for t in lens["layers"][-1]["top"]] == [t["id"] for t in wide["tokens"][:5]]  # = the logits
    nxt = lens["next"]
    assert nxt["id"] == ids[position + 1] and rows[-1].find_element(By.CSS_SELECTOR, "td.rank").text.startswith(
        f"rank {lens['layers'][-1]['next']['rank']}, p = "
    )
    save(d, tmp_path, "explore-lens.png")

    # positions: the table the model adds (or rotary's angles), drawn, the selected position outlined
    find('.tabs button[data-view="positions"]').click()
    pos = ex.positions({"ids": ids, "position": position})
    wait.until(lambda _: f"is at position {pos['position']}" in find("#p-summary").text)
    ink, _ = d.execute_script(PIXELS, find("#p-map"))
    m = ex.cfg.model
    assert ink > 10_000  # the table is drawn
    if pos["kind"] == "rope":
        assert f"{m.head_dim // 2} pairs" in find("#p-summary").text
    else:
        assert f"norm {pos['norms']['position']:.3f}" in find("#p-summary").text
        shown = [float(x) for x in find("#p-row").text.split("[")[1].rstrip("…]").rstrip(", ").split(", ")]
        assert len(shown) == 8 and all(abs(a - b) < 1.1e-3 for a, b in zip(shown, pos["table"][pos["position"]]))
    save(d, tmp_path, "explore-positions.png")

    # back to attention: the selection is kept
    find('.tabs button[data-view="attention"]').click()
    wait.until(lambda _: find("#attention").is_displayed() and find("#query-label").text)
    assert find_all("#tokens .tok.query")[0].get_attribute("data-index") == str(position)
    find_all("#grid canvas")[-1].click()  # the last layer's last head
    wait.until(lambda _: find("#head-title").text.startswith(f"Layer {L - 1}, head {ex.cfg.model.n_head - 1}"))
    save(d, tmp_path, "explore.png")
    assert not find("#error").is_displayed()
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
