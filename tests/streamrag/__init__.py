"""The user's side (streamrag/): the CLI's command table, `streamrag up | status | down` and its
supervisor, the demo."""
