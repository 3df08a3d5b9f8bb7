"""The HTTP server: mq's REST API, the Amazon SQS JSON protocol, metrics (``journalq serve``)."""
