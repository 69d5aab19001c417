"""What minitf shows: the explorer's page (`explore`), the OpenAI-compatible server (`serve`), the
HTTP stack both stand on (`stack`: uvicorn with deadlines and a graceful stop; `http_io`: guards,
bounded bodies, streams, error answers; `strict_json`), and the request fields both check (`fields`).
Figures drawn to files are minitf/plots/."""
