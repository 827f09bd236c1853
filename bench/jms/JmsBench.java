// The JMS scenarios' client for ActiveMQ: a JMS 1.1 OpenWire client (Debian's activemq-client
// jar), compiled by bench/run_jms.py with javac at bench time. It only counts what it sent and
// received; the harness measures the broker.
//
// Protocol with its Python worker (bench/kwbench/jms_loadgen.py): arguments key=value; prints
// READY once connected (consumers: subscribed), reads GO from stdin, runs, prints one line
// "RESULT {json}" with the same fields as the Python clients, exits.
//
// Before READY, a JVM warms its JIT up with ``warmup`` NON_PERSISTENT send/receive round trips
// on a queue of its own (the Python clients have no JIT to warm).
//
// Every setting is the client's default (queue prefetch 1000, topic prefetch 32766,
// PERSISTENT sends synchronous, NON_PERSISTENT and transacted sends asynchronous, commit
// synchronous), as an application that does not tune the factory gets them.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import javax.jms.Connection;
import javax.jms.DeliveryMode;
import javax.jms.Destination;
import javax.jms.Message;
import javax.jms.MessageConsumer;
import javax.jms.MessageProducer;
import javax.jms.Session;
import javax.jms.TextMessage;
import org.apache.activemq.ActiveMQConnectionFactory;

public final class JmsBench {
    static final int COMMIT_EVERY = 100;
    static final int MAX_SAMPLES = 20000;
    static final String PAD = "x".repeat(84);
    static final Map<String, String> ARGS = new HashMap<>();

    static String arg(String key) {
        String value = ARGS.get(key);
        if (value == null) {
            throw new IllegalArgumentException("missing argument " + key);
        }
        return value;
    }

    static boolean flag(String key) {
        return Boolean.parseBoolean(arg(key));
    }

    static long nanos(String key) {
        return (long) (Double.parseDouble(arg(key)) * 1e9);
    }

    static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean)
                ManagementFactory.getOperatingSystemMXBean()).getProcessCpuTime();
    }

    static String body(long sendNanos) {
        return String.format("%016x", sendNanos) + PAD;
    }

    static Destination destination(Session session) throws Exception {
        String name = arg("destination");
        return arg("kind").equals("queue") ? session.createQueue(name) : session.createTopic(name);
    }

    static void awaitGo() throws Exception {
        System.out.println("READY");
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line = in.readLine();
        if (!"GO".equals(line)) {
            throw new IllegalStateException("expected GO, got " + line);
        }
    }

    public static void main(String[] args) throws Exception {
        for (String a : args) {
            int i = a.indexOf('=');
            ARGS.put(a.substring(0, i), a.substring(i + 1));
        }
        ActiveMQConnectionFactory factory = new ActiveMQConnectionFactory(arg("url"));
        warmUp(factory, Integer.parseInt(ARGS.getOrDefault("warmup", "0")));
        if (arg("role").equals("producer")) {
            produce(factory);
        } else {
            consume(factory);
        }
        System.exit(0);
    }

    static void warmUp(ActiveMQConnectionFactory factory, int rounds) throws Exception {
        if (rounds <= 0) {
            return;
        }
        Connection connection = factory.createConnection();
        connection.start();
        Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
        Destination queue = session.createQueue(
                "kwbench.warmup." + ProcessHandle.current().pid());
        MessageProducer producer = session.createProducer(queue);
        producer.setDeliveryMode(DeliveryMode.NON_PERSISTENT);
        MessageConsumer consumer = session.createConsumer(queue);
        for (int i = 0; i < rounds; i++) {
            producer.send(session.createTextMessage(body(System.nanoTime())));
            Message message = consumer.receive(5000);
            if (message == null) {
                throw new IllegalStateException("warm-up message " + i + " did not come back");
            }
            ((TextMessage) message).getText();
        }
        connection.close();
    }

    static void produce(ActiveMQConnectionFactory factory) throws Exception {
        boolean transacted = flag("transacted");
        int count = Integer.parseInt(arg("count"));
        Connection connection = factory.createConnection();
        connection.start();
        Session session = connection.createSession(
                transacted, transacted ? Session.SESSION_TRANSACTED : Session.AUTO_ACKNOWLEDGE);
        MessageProducer producer = session.createProducer(destination(session));
        producer.setDeliveryMode(flag("persistent") ? DeliveryMode.PERSISTENT
                                                    : DeliveryMode.NON_PERSISTENT);
        awaitGo();
        long cpu0 = cpuNanos();
        long first = System.nanoTime();
        long end = first + nanos("deadline_s");
        boolean sync = flag("sync_send");
        int sent = 0;
        int acked = 0;
        boolean timedOut = false;
        while (sent < count) {
            producer.send(session.createTextMessage(body(System.nanoTime())));
            sent++;
            if (transacted && (sent % COMMIT_EVERY == 0 || sent == count)) {
                session.commit();
                acked = sent;
            } else if (sync) {
                acked = sent;
            }
            if ((sent & 255) == 0 && System.nanoTime() > end) {
                timedOut = true;
                break;
            }
        }
        connection.close();
        long last = System.nanoTime();
        long cpu1 = cpuNanos();
        String ackedJson = transacted || sync ? Integer.toString(acked) : "null";
        System.out.println("RESULT {\"kind\": \"producer\", \"sent\": " + sent + ", \"acked\": "
                + ackedJson + ", \"first_ns\": " + first + ", \"last_ns\": " + last
                + ", \"cpu_s\": " + (cpu1 - cpu0) / 1e9 + ", \"timed_out\": " + timedOut
                + ", \"errors\": []}");
        System.out.flush();
    }

    static void consume(ActiveMQConnectionFactory factory) throws Exception {
        boolean transacted = flag("transacted");
        int expected = Integer.parseInt(arg("count"));
        int consumers = Integer.parseInt(arg("consumers"));
        long idleLimit = nanos("idle_timeout_s");
        long deadline = nanos("deadline_s");
        List<Connection> connections = new ArrayList<>();
        List<Session> sessions = new ArrayList<>();
        List<MessageConsumer> receivers = new ArrayList<>();
        for (int i = 0; i < consumers; i++) {
            Connection connection = factory.createConnection();
            Session session = connection.createSession(
                    transacted, transacted ? Session.SESSION_TRANSACTED : Session.AUTO_ACKNOWLEDGE);
            receivers.add(session.createConsumer(destination(session)));
            connection.start();
            connections.add(connection);
            sessions.add(session);
        }
        awaitGo();
        long cpu0 = cpuNanos();
        long end = System.nanoTime() + deadline;
        int stride = Math.max(1, expected * consumers / MAX_SAMPLES);
        long[] counts = new long[consumers];
        AtomicLong first = new AtomicLong(Long.MAX_VALUE);
        AtomicLong last = new AtomicLong(0);
        AtomicBoolean timedOut = new AtomicBoolean(false);
        List<String> errors = java.util.Collections.synchronizedList(new ArrayList<>());
        List<Long> samples = java.util.Collections.synchronizedList(new ArrayList<>());
        CountDownLatch done = new CountDownLatch(consumers);
        for (int i = 0; i < consumers; i++) {
            final int index = i;
            Thread thread = new Thread(() -> {
                Session session = sessions.get(index);
                MessageConsumer receiver = receivers.get(index);
                long quietSince = System.nanoTime();
                int n = 0;
                try {
                    while (n < expected) {
                        Message message = receiver.receive(500);
                        long now = System.nanoTime();
                        if (message == null) {
                            if (now - quietSince > idleLimit || now > end) {
                                timedOut.set(true);
                                break;
                            }
                            continue;
                        }
                        quietSince = now;
                        n++;
                        first.accumulateAndGet(now, Math::min);
                        if (transacted) {
                            if (n % COMMIT_EVERY == 0 || n == expected) {
                                session.commit();
                                counts[index] = n;
                                last.accumulateAndGet(System.nanoTime(), Math::max);
                            }
                        } else {
                            counts[index] = n;
                            last.accumulateAndGet(now, Math::max);
                        }
                        if (n % stride == 0) {
                            String text = ((TextMessage) message).getText();
                            samples.add(now - Long.parseUnsignedLong(text.substring(0, 16), 16));
                        }
                    }
                } catch (Exception e) {
                    errors.add("consumer " + index + ": " + e);
                } finally {
                    done.countDown();
                }
            });
            thread.setDaemon(true);
            thread.start();
        }
        done.await();
        long cpu1 = cpuNanos();
        for (Connection connection : connections) {
            connection.close();
        }
        long received = 0;
        StringBuilder per = new StringBuilder();
        for (int i = 0; i < consumers; i++) {
            received += counts[i];
            per.append(i == 0 ? "" : ", ").append(counts[i]);
        }
        StringBuilder sampleJson = new StringBuilder();
        synchronized (samples) {
            for (int i = 0; i < samples.size(); i++) {
                sampleJson.append(i == 0 ? "" : ", ").append(samples.get(i));
            }
        }
        StringBuilder errorJson = new StringBuilder();
        synchronized (errors) {
            for (int i = 0; i < errors.size(); i++) {
                errorJson.append(i == 0 ? "" : ", ").append('"')
                        .append(errors.get(i).replace("\\", "\\\\").replace("\"", "'"))
                        .append('"');
            }
        }
        long firstNs = first.get() == Long.MAX_VALUE ? 0 : first.get();
        System.out.println("RESULT {\"kind\": \"consumer\", \"received\": " + received
                + ", \"per_consumer\": [" + per + "], \"first_ns\": " + firstNs
                + ", \"last_ns\": " + last.get() + ", \"samples\": [" + sampleJson + "]"
                + ", \"cpu_s\": " + (cpu1 - cpu0) / 1e9 + ", \"timed_out\": " + timedOut.get()
                + ", \"errors\": [" + errorJson + "]}");
        System.out.flush();
    }
}
