"""The operators' HTTP listener: the web console, /metrics and the admin JSON API, on the
broker's own event loop. Reads the core through broker.inspection and acts through its
methods; never on the message path."""
