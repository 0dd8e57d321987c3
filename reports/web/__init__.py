"""The web process's own machinery, whatever routes it serves: the guards every request passes
(guards) and the uvicorn server that bounds what a client may hold (server)."""
