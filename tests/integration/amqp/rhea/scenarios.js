// rhea as an AMQP 1.0 client of Kittiwake: one scenario per run, its result as one JSON line.
// Usage: node scenarios.js <host> <port> <scenario> <address>
'use strict';
const rhea = require('rhea');
// rhea has no transactions: the coordinator target and transactional-state are built from
// its types, and its transfer frame gains the state (see transactional()).
const frames = require('rhea/lib/frames.js');

const types = rhea.types;

// A coordinator control message (declare 0x31, discharge 0x32) as an amqp-value section,
// encoded here: rhea's encoder would replace the body's own descriptor with the section's.
function control(descriptor, fields) {
  const writer = new types.Writer();
  writer.write(types.described(types.wrap_ulong(descriptor), types.wrap_list(fields)));
  return Buffer.concat([Buffer.from([0x00, 0x53, 0x77]), writer.toBuffer()]);
}

// The descriptor code of an outcome or state rhea could not name (declared 0x33,
// transactional-state 0x34) or could (accepted 0x24, rejected 0x25).
function described_code(value) {
  if (!value) return null;
  if (value.descriptor) return Number(value.descriptor.value);
  return value.constructor && value.constructor.descriptor
    ? Number(value.constructor.descriptor.numeric) : null;
}

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

Object.assign(scenarios, {
  // A topic subscription with a JMS selector, the filter as Qpid JMS sends it (key
  // jms-selector, descriptor 0x0000468C00000004): only matching messages arrive, in order.
  selector() {
    const receiver = connection.open_receiver({
      source: { address, filter: rhea.filter.selector("colour = 'blue'") },
      credit_window: 10,
    });
    const got = [];
    receiver.on('receiver_open', (context) => {
      const filter = context.receiver.remote.attach.source.filter || {};
      const echoed = filter['jms-selector'];
      const sender = connection.open_sender({ target: { address } });
      const colours = [['r1', 'red'], ['b2', 'blue'], ['r3', 'red'], ['end', 'blue']];
      sender.once('sendable', () => {
        for (const [body, colour] of colours) {
          sender.send({ body, application_properties: { colour } });
        }
      });
      receiver.on('message', (message_context) => {
        const message = message_context.message;
        got.push(message.body);
        if (message.body === 'end') {
          finish({
            got,
            echoed: echoed ? {
              descriptor: Number(echoed.descriptor.value),
              selector: String(echoed.value),
            } : null,
          });
        }
      });
    });
  },
  // A durable subscription (durable: 2 = unsettled-state, expiry never, the link name its
  // subscription name) detached, fed while away, attached again: it resumes with what it
  // collected; closing the link at the end unsubscribes it.
  durable() {
    const source = { address, durable: 2, expiry_policy: 'never', capabilities: ['topic'] };
    const sender = connection.open_sender({ target: { address } });
    const got = [];
    let resumed = null;
    function attach(then) {
      const receiver = connection.open_receiver({ name: 'sub', source, credit_window: 10 });
      receiver.once('receiver_open', (context) => {
        const remote = context.receiver.remote.attach.source;
        if (resumed === null) resumed = false;
        else resumed = { durable: remote.durable, expiry_policy: remote.expiry_policy };
        then(receiver);
      });
      return receiver;
    }
    let state = 'first';
    sender.on('accepted', () => {
      if (state === 'away') {
        state = 'again';
        attach((receiver) => receiver.on('message', (context) => {
          got.push(context.message.body);
          receiver.once('receiver_close', () => finish({ got, resumed }));
          receiver.close();  // a close, not a detach: the subscription ends
        }));
      }
    });
    attach((receiver) => {
      receiver.on('message', (context) => {
        got.push(context.message.body);
        receiver.once('receiver_close', () => {
          state = 'away';
          sender.send({ body: 'while away', durable: true });
        });
        receiver.detach();
      });
      sender.send({ body: 'before', durable: true });
    });
  },
  // A local transaction through the coordinator: declare, a transactional send, discharge
  // (commit). Before the commit the message is invisible: a later untransacted message to the
  // same queue comes out first.
  transaction() {
    const states = new Map();  // sender link handle -> transactional-state of its transfers
    const plainTransfer = frames.transfer;
    frames.transfer = (fields) => {
      const frame = plainTransfer(fields);
      const state = states.get(fields.handle);
      if (state !== undefined) {
        frame.value[6] = types.Null();  // rcv-settle-mode
        frame.value[7] = state;
      }
      return frame;
    };
    const coordinator = connection.open_sender({ name: 'txn-coordinator' });
    coordinator.local.attach.target = types.described(
      types.wrap_ulong(0x30),
      types.wrap_list([types.wrap_array(['amqp:local-transactions'], types.Sym8.typecode)])
    );
    const result = {};
    let txnId = null;
    let phase = 'declare';
    coordinator.on('sendable', () => {
      if (phase !== 'declare') return;
      phase = 'declaring';
      coordinator.send(control(0x31, []), undefined, 0);
    });
    coordinator.on('settled', (context) => {
      const outcome = context.delivery.remote_state;
      if (phase === 'declaring') {
        result.declared = described_code(outcome) === 0x33;
        txnId = result.declared ? outcome.value[0].value : null;
        phase = 'sending';
        send();
      } else if (phase === 'discharging') {
        result.discharged = described_code(outcome) === 0x24;  // accepted
        phase = 'committed';
        done();
      }
    });
    const sender = connection.open_sender({ target: { address } });
    const plain = connection.open_sender({ target: { address } });
    function send() {
      states.set(sender.local.handle, types.described(
        types.wrap_ulong(0x34), types.wrap_list([types.wrap_binary(txnId)])
      ));
      sender.send({ body: 'in transaction', durable: true });
    }
    sender.on('settled', (context) => {
      result.send_state = described_code(context.delivery.remote_state);
      plain.send({ body: 'outside', durable: true });
    });
    const got = [];
    plain.on('accepted', () => {
      const receiver = connection.open_receiver({ source: { address }, credit_window: 10 });
      receiver.on('message', (context) => {
        got.push(context.message.body);
        if (got.length === 1) {
          phase = 'discharging';
          coordinator.send(control(0x32, [types.wrap_binary(txnId), false]), undefined, 0);
        } else {
          done();
        }
      });
    });
    function done() {  // the committed message and the discharge's outcome, in either order
      if (got.length === 2 && 'discharged' in result) finish({ ...result, got });
    }
  },
  // Request/reply through a dynamic (temporary) queue: the requester's receiver asks for a
  // dynamic source, the broker names it, a responder on another connection replies to it.
  request_reply() {
    const responder = container.connect({ host, port: Number(port), reconnect: false });
    responder.on('connection_open', () => {
      const requests = responder.open_receiver({ source: { address }, credit_window: 10 });
      requests.on('receiver_open', ask);
      requests.on('message', (context) => {
        const request = context.message;
        const replies = responder.open_sender({ target: { address: request.reply_to } });
        replies.once('sendable', () => replies.send({
          body: 'reply to ' + request.body, correlation_id: request.message_id,
        }));
        replies.on('rejected', (rejected) => finish({
          error: 'reply rejected: ' + String(rejected.delivery.remote_state.error),
        }));
      });
    });
    function ask() {
      const replies = connection.open_receiver({ source: { dynamic: true }, credit_window: 10 });
      replies.on('receiver_open', (context) => {
        const temporary = context.receiver.remote.attach.source.address;
        const requests = connection.open_sender({ target: { address } });
        requests.once('sendable', () => requests.send({
          body: 'question', message_id: 'req-1', reply_to: temporary,
        }));
        replies.on('message', (message_context) => {
          const reply = message_context.message;
          responder.close();
          finish({
            reply: reply.body,
            correlation_id: reply.correlation_id,
            temporary: Boolean(temporary) && temporary !== address,
          });
        });
      });
    }
  },
  // A queue browser (distribution-mode copy) sees the messages and consumes nothing: a
  // consumer afterwards gets them all.
  browse() {
    const sender = connection.open_sender({ target: { address } });
    let sent = 0;
    sender.on('sendable', () => {
      while (sender.sendable() && sent < 2) {
        sent += 1;
        sender.send({ body: 'm' + sent, durable: true });
      }
    });
    let accepted = 0;
    sender.on('accepted', () => {
      accepted += 1;
      if (accepted === 2) browse();
    });
    const result = { browsed: [], consumed: [] };
    function browse() {
      const browser = connection.open_receiver({
        source: { address, distribution_mode: 'copy' }, credit_window: 10,
      });
      browser.on('receiver_open', (context) => {
        result.mode = context.receiver.remote.attach.source.distribution_mode || null;
      });
      browser.on('message', (context) => {
        result.browsed.push(context.message.body);
        if (result.browsed.length === 2) {
          browser.once('receiver_close', consume);
          browser.close();
        }
      });
    }
    function consume() {
      const receiver = connection.open_receiver({ source: { address }, credit_window: 10 });
      receiver.on('message', (context) => {
        result.consumed.push(context.message.body);
        if (result.consumed.length === 2) finish(result);
      });
    }
  },
});

connection.on('connection_open', () => scenarios[scenario]());
