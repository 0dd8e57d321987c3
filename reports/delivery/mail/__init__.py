"""Composing report emails and handing them to a mail backend (SMTP or a Maildir outbox)."""
