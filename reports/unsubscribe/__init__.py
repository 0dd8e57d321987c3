"""A recipient's opt-out: signed unsubscribe links, the suppression list and the web pages."""
