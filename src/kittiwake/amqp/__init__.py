"""The AMQP 1.0 front end: translates AMQP connections, links and messages to core calls."""
