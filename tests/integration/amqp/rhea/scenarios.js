// rhea as an AMQP 1.0 client of Kittiwake: one scenario per run, its result as one JSON line.
// Usage: node scenarios.js <host> <port> <scenario> <address>
'use strict';
const rhea = require('rhea');

const [host, port, scenario, address] = process.argv.slice(2);
const container = rhea.create_container({ id: 'rhea-' + process.pid });
const connection = container.connect({ host, port: Number(port), reconnect: false });
const timer = setTimeout(() => finish({ error: 'timeout' }), 10000);

function finish(result) {
  clearTimeout(timer);
  process.stdout.write(JSON.stringify(result) + '\n');
  connection.close();
  setTimeout(() => process.exit(0), 100);
}

connection.on('connection_error', (context) => finish({ error: String(context.connection.error) }));
connection.on('disconnected', (context) => {
  if (context.error) finish({ error: String(context.error) });
});

const scenarios = {
  // Send three messages to a queue, then consume them with acceptance.
  queue() {
    const sender = connection.open_sender({ target: { address } });
    let sent = 0;
    sender.on('sendable', () => {
      while (sender.sendable() && sent < 3) {
        sent += 1;
        sender.send({ body: 'm' + sent, durable: true, application_properties: { n: sent } });
      }
    });
    let accepted = 0;
    sender.on('accepted', () => {
      accepted += 1;
      if (accepted === 3) receive();
    });
    function receive() {
      const got = [];
      const receiver = connection.open_receiver({ source: { address }, credit_window: 10 });
      receiver.on('message', (context) => {
        got.push({ body: context.message.body, n: context.message.application_properties.n });
        context.delivery.accept();
        if (got.length === 3) finish({ got });
      });
    }
  },
  // A failed delivery (modified, delivery-failed) comes back with its count incremented.
  redeliver() {
    const sender = connection.open_sender({ target: { address } });
    sender.once('sendable', () => sender.send({ body: 'again' }));
    sender.on('accepted', () => {
      const counts = [];
      const receiver = connection.open_receiver({
        source: { address }, credit_window: 1, autoaccept: false,
      });
      receiver.on('message', (context) => {
        counts.push(context.message.delivery_count || 0);
        if (counts.length === 1) {
          context.delivery.modified({ delivery_failed: true });
        } else {
          context.delivery.accept();
          finish({ counts });
        }
      });
    });
  },
  // Subscribe to a topic (MQTT wildcards allowed) and print the first message.
  subscribe() {
    const receiver = connection.open_receiver({ source: { address }, credit_window: 10 });
    receiver.on('receiver_open', () => process.stdout.write('{"ready": true}\n'));
    receiver.on('message', (context) => {
      const message = context.message;
      const body = Buffer.isBuffer(message.body) ? message.body.toString()
        : (message.body && message.body.content) ? Buffer.from(message.body.content).toString()
        : message.body;
      finish({ body, durable: Boolean(message.durable), to: message.to || null });
    });
  },
  // Publish one persistent text message to a topic.
  publish() {
    const sender = connection.open_sender({ target: { address } });
    sender.once('sendable', () => sender.send({ body: 'from rhea', durable: true }));
    sender.on('accepted', () => finish({ accepted: true }));
    sender.on('rejected', (context) => finish({ rejected: String(context.delivery.remote_state.error) }));
  },
};

connection.on('connection_open', () => scenarios[scenario]());
