"""Provider feedback: bounces and complaints from the mail providers' webhooks feed the suppression list."""
