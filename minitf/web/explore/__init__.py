"""The explorer, a local web page over a trained run: type a prompt, watch tokens stream, click any
token for its attention step by step, the next token under the sampler's settings, the logit lens
and its position signal (`python scripts/explore.py`). The one self-contained app in minitf:
server.py is its routes (a FastAPI app on uvicorn), api.py answers the page's requests from the
library's own functions, and static/ holds the page."""

from .api import BadRequest, Busy, Explorer
from .server import STATIC, ExploreServer, serve

__all__ = ["STATIC", "BadRequest", "Busy", "ExploreServer", "Explorer", "serve"]
