"""What minitf shows: the explorer's page (`explore`), the OpenAI-compatible server (`serve`),
the HTTP layer both stand on (`connections`, `json_http`), and figures drawn to files (`figures`)."""
