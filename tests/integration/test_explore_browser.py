"""The explorer in a real browser: headless Chromium (Debian's chromium and chromium-driver)
driven by Selenium types a prompt, generates, opens a token's attention and each of its other views
(next token, logit lens, positions, heads, attribution), checks what they show against the API, and
saves screenshots.
Skipped, with the reason, where Chromium, its driver or Selenium is missing (.ci/run installs them).

The screenshots in docs/ are these tests' own: MINITF_EXPLORE_RUN=runs/shakespeare points the
views' tests at a trained run instead of the tiny one, and MINITF_EXPLORE_SHOTS=docs saves their
screenshots there as well as in the test's temporary directory."""

import json
import os
import re
import shutil
import threading
import urllib.request
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


# the loss chart's legend and its plot area, as boxes [x, y, width, height] in the SVG's own units
LEGEND = """const svg = document.getElementById('loss');
if (!svg.querySelector('path')) return [[], null, []];  // the chart is not drawn yet: the wait goes on
const box = (e) => { const b = e.getBBox(); return [b.x, b.y, b.width, b.height]; };
const legend = [...svg.querySelectorAll('text')].filter((t) => t.textContent.endsWith(' loss'));
return [legend.map((t) => [t.textContent, box(t)]), box(svg.querySelector('path')),
        [...svg.querySelectorAll('polyline, circle')].map(box)];"""


def test_the_loss_legend_never_sits_on_a_curve(browser, explore_server, tiny_run):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(explore_server.url)
    WebDriverWait(browser, 15).until(lambda d: len(d.execute_script(LEGEND)[0]) == 2)
    legend, (ax, ay, aw, ah), marks = browser.execute_script(LEGEND)
    assert [name for name, _ in legend] == ["train loss", "val loss"]
    for _, (x, y, _, h) in legend:  # above the plot area, where no curve or dot can be drawn
        assert y + h <= ay and x >= ax
    assert marks and all(my >= ay - 3 and my + mh <= ay + ah + 3 for _, my, _, mh in marks)  # dots: radius 2.5


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
        assert f"{m.head_size // 2} pairs" in find("#p-summary").text
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


# the text has repeats, so the induction and duplicate-token heads have something to find
REPEATS = "ROMEO: O love, sweet night! ROMEO: O love"


# a grid's cells (#h-grid, #a-grid) as [text, class], and a table's rows after the header as cell texts
CELLS = "return [...document.querySelectorAll(arguments[0] + ' .cell')].map(c => [c.innerText.trim(), c.className]);"


ROWS = """return [...document.querySelectorAll(arguments[0] + ' tr')].slice(1).map(
  tr => [...tr.querySelectorAll('td')].map(td => td.innerText.trim()));"""


def post(server, view: str, body: dict) -> dict:
    """The JSON of POST /api/<view>, as the page gets it."""
    req = urllib.request.Request(
        server.url.rstrip("/") + f"/api/{view}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def signed(text: str) -> float:
    """A number as the page signs it: +0.123, −0.123 (a minus sign, U+2212)."""
    return float(text.replace("\u2212", "-"))


def open_view(d, wait, server, view: str) -> tuple[list[int], int]:
    """Type REPEATS, generate a few tokens, click the prompt's last token and open a tab: the ids and that position."""
    from selenium.webdriver.common.by import By

    d.get(server.url)
    wait.until(lambda _: d.find_element(By.ID, "run-name").text == server.explorer.run_dir.name)
    for name, value in (("prompt", REPEATS), ("max_new_tokens", "6"), ("seed", "3"), ("temperature", "1")):
        d.find_element(By.ID, name).clear()
        d.find_element(By.ID, name).send_keys(value)
    d.find_element(By.ID, "go").click()
    wait.until(lambda _: "tokens," in d.find_element(By.ID, "status").text)
    ids = d.execute_script("return state.ids")
    position = len(ids) - len(d.find_elements(By.CSS_SELECTOR, "#tokens .tok.gen")) - 1
    d.find_elements(By.CSS_SELECTOR, "#tokens .tok")[position].click()
    d.find_element(By.CSS_SELECTOR, f'.tabs button[data-view="{view}"]').click()
    wait.until(
        lambda _: d.find_element(By.ID, view).is_displayed() and not d.find_element(By.ID, "attention").is_displayed()
    )
    return ids, position


def until_shown(wait, check) -> None:
    """Wait for the page to pass check() (it draws an answer a moment after a click), then check once
    more, so that a page that never does fails with what differs."""
    from selenium.common.exceptions import StaleElementReferenceException

    def done(_):
        try:
            check()
            return True
        except (AssertionError, ValueError, IndexError, StaleElementReferenceException):
            return False

    try:
        wait.until(done)
    finally:
        check()


def no_errors(d) -> None:
    from selenium.webdriver.common.by import By

    assert not d.find_element(By.ID, "error").is_displayed()
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def test_heads_scores_and_switching_heads_off(browser, views_server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    d, wait, ex = browser, WebDriverWait(browser, 30), views_server.explorer
    L, H = ex.cfg.model.n_layer, ex.cfg.model.n_head
    ids, position = open_view(d, wait, views_server, "heads")
    label = ex.label(ids[position])

    def check(want, score: str) -> None:
        """The grid shows the API's `score` of every head (to the 2 decimals shown), the heads it
        switched off crossed out; the table its next tokens with every head and without those."""
        assert d.execute_script("return document.querySelector('#heads .sel-label').textContent") == f"“{label}”"
        assert Select(d.find_element(By.ID, "h-score")).first_selected_option.get_attribute("value") == score
        cells = d.execute_script(CELLS, "#h-grid")
        values = [v for row in want["scores"][score] for v in row]
        assert len(cells) == len(values) == L * H
        assert all(abs(float(text) - v) <= 0.005 + 1e-9 for (text, _), v in zip(cells, values))
        off = [["off" in cls.split() for _, cls in cells[i * H : (i + 1) * H]] for i in range(L)]
        assert off == [[[i, h] in want["heads"] for h in range(H)] for i in range(L)]
        rows = d.execute_script(ROWS, "#h-table")
        assert [r[1] for r in rows] == [t["label"] for t in want["tokens"]]
        for r, t in zip(rows, want["tokens"]):
            assert int(r[0]) == t["rank"] and abs(percent(r[2]) - t["before"]) < 6e-4
            if want["heads"]:
                assert abs(percent(r[3]) - t["after"]) < 6e-4
                assert abs(signed(r[4].removesuffix("pt")) - 100 * (t["after"] - t["before"])) < 6e-4
            else:
                assert r[3] == r[4] == ""
        summary = d.find_element(By.ID, "h-summary").text
        if want["heads"]:
            n = len(want["heads"])
            assert summary.startswith(f"{n} head{'s' if n > 1 else ''} off")
            assert ", ".join(f"L{i}H{h}" for i, h in want["heads"]) in summary
            loss = [float(x) for x in re.search(r"over the text: ([\d.]+) → ([\d.]+)\.", summary).groups()]
            assert all(abs(a - b) < 6e-4 for a, b in zip(loss, (want["loss"]["before"], want["loss"]["after"])))
        else:
            assert summary.startswith("Every head is on")

    def shows(heads: list, mode: str = "zero", score: str = "induction") -> dict:
        want = post(views_server, "heads", {"ids": ids, "position": position, "heads": heads, "mode": mode, "top": 8})
        until_shown(wait, lambda: check(want, score))
        return want

    every = shows([])  # every head on, the induction scores first
    assert all(t["before"] == t["after"] for t in every["tokens"])
    for score in ("previous_token", "duplicate_token", "induction"):
        Select(d.find_element(By.ID, "h-score")).select_by_value(score)
        shows([], score=score)

    def click(layer: int, head: int) -> None:
        d.find_elements(By.CSS_SELECTOR, "#h-grid .cell")[layer * H + head].click()

    click(0, H - 1)
    one = shows([[0, H - 1]])
    assert any(t["before"] != t["after"] for t in one["tokens"])  # a head off changes the next token
    click(L - 1, 0)
    two = shows([[0, H - 1], [L - 1, 0]])
    Select(d.find_element(By.ID, "h-mode")).select_by_value("mean")
    mean = shows([[0, H - 1], [L - 1, 0]], "mean")
    assert one["tokens"] != two["tokens"] != mean["tokens"]  # each click shows a new answer
    save(d, tmp_path, "explore-heads.png")
    click(0, H - 1)  # on again
    shows([[L - 1, 0]], "mean")
    d.find_element(By.ID, "h-clear").click()
    shows([], "mean")
    no_errors(d)


def test_attribution_of_the_next_tokens_logit(browser, views_server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d, wait, ex = browser, WebDriverWait(browser, 30), views_server.explorer
    L, H = ex.cfg.model.n_layer, ex.cfg.model.n_head
    ids, position = open_view(d, wait, views_server, "attribution")

    def check(want) -> None:
        """The grid shows each head's share and the table every other part's, as the API gives them
        (to the 3 decimals shown); the shares add up to the logit the page shows."""
        target = d.execute_script("return document.getElementById('a-target').textContent")
        assert target == f"“{want['target']['label']}”"
        cells = d.execute_script(CELLS, "#a-grid")
        heads = [v for row in want["heads"] for v in row]
        assert len(cells) == len(heads) == L * H
        assert all(abs(signed(text) - v) < 6e-4 for (text, _), v in zip(cells, heads))
        parts = [("token embedding", want["parts"]["embedding"]), ("position vectors", want["parts"]["positions"])]
        for layer in range(L):
            parts.append((f"layer {layer}: attention output bias", want["attn_bias"][layer]))
            parts.append((f"layer {layer}: feed-forward", want["ffn"][layer]))
        parts += [("all heads (the grid)", sum(heads)), ("final norm's bias", want["parts"]["norm_bias"])]
        *rows, last = d.execute_script(ROWS, "#a-table")
        assert [r[0] for r in rows] == [name for name, _ in parts]
        assert all(abs(signed(r[1]) - v) < 6e-4 for r, (_, v) in zip(rows, parts))
        total, logit = (signed(x) for x in re.fullmatch(r"(\S+) \(the model's: (\S+)\)", last[1]).groups())
        assert last[0] == "sum: the logit" and abs(total - want["total"]) < 6e-4 and abs(logit - want["logit"]) < 6e-4
        assert abs(sum(signed(r[1]) for r in rows) - logit) < 6e-4 * len(rows) + 1e-3
        choices = d.find_elements(By.CSS_SELECTOR, "#a-choices button")
        assert [b.text for b in choices] == [c["label"].strip() for c in want["choices"]]

    # by default the token that follows on the page
    first = post(views_server, "attribution", {"ids": ids, "position": position})
    assert first["target"]["id"] == ids[position + 1] == first["next"]["id"]
    until_shown(wait, lambda: check(first))
    assert abs(first["total"] - first["logit"]) < 1e-3

    # another of the model's likeliest tokens, picked with its button
    i, other = next((i, c) for i, c in enumerate(first["choices"]) if c["id"] != first["target"]["id"])
    d.find_elements(By.CSS_SELECTOR, "#a-choices button")[i].click()
    second = post(views_server, "attribution", {"ids": ids, "position": position, "token": other["id"]})
    assert second["target"]["id"] == other["id"] and second["heads"] != first["heads"]
    until_shown(wait, lambda: check(second))
    save(d, tmp_path, "explore-attribution.png")
    no_errors(d)
