"""The operator console at ``/console/`` on the web process: every period, dead letter, suppression
and the fleet's state, and the operator's actions, each through the library call its ``reports``
command makes."""
