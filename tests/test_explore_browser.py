"""The explorer in a real browser: headless Chromium (Debian's chromium and chromium-driver)
driven by Selenium types a prompt, generates, opens a token's attention and saves a screenshot.
Skipped, with the reason, where Chromium, its driver or Selenium is missing (.ci/run installs them)."""

import shutil

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
