"""One user's report delivered once: the pipeline, its claim, the breaker, the send rate and the mail."""
