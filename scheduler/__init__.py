"""The scheduler process (``python -m scheduler``): it triggers each month's run and reconciles
unfinished ones. It only sends messages and calls the library; see :mod:`scheduler.process`."""
