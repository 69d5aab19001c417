"""The explorer and the OpenAI-compatible server, and the HTTP layer they share.

What minitf shows: the explorer's page (`explore`), the OpenAI-compatible server (`serve`), the
HTTP stack both stand on (`stack`: uvicorn with deadlines and a graceful stop; `connections`: who
may hold a connection, and for how long; `http_io`: guards,
bounded bodies, streams, error answers; `strict_json`), and the request fields both check (`fields`).
Figures drawn to files are minitf/plots/."""
