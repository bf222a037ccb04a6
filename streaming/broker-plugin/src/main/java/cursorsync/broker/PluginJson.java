package cursorsync.broker;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import java.io.IOException;
import java.io.Writer;
import java.util.List;
import java.util.Map;
import org.apache.bookkeeper.mledger.Position;

/**
 * The endpoints' JSON, written with the broker's own jackson-core. Every answer, errors
 * included, says {"plugin": "cursorsync"}: a 404 without it is the broker saying the plugin
 * is not loaded, one with it is the plugin saying the topic or subscription is unknown.
 */
final class PluginJson {

    static final String PLUGIN = "cursorsync";
    private static final JsonFactory JSON = new JsonFactory();

    private PluginJson() {
    }

    static void writeView(Writer out, String topic, String subscription,
                          PartialBatches.CursorView view) throws IOException {
        try (JsonGenerator g = JSON.createGenerator(out)) {
            g.writeStartObject();
            g.writeStringField("plugin", PLUGIN);
            g.writeStringField("topic", topic);
            g.writeStringField("subscription", subscription);
            g.writeStringField("markDeletePosition", text(view.markDelete()));
            g.writeBooleanField("batchIndexAcks", view.batchIndexAcks());
            g.writeArrayFieldStart("entries");
            for (PartialBatch b : view.batches()) {
                g.writeStartObject();
                g.writeStringField("position", text(b.position()));
                g.writeNumberField("batchSize", b.batchSize());
                g.writeFieldName("ackSet");
                g.writeArray(b.ackSet(), 0, b.ackSet().length);
                g.writeFieldName("ackedIndexes");
                int[] acked = b.ackedIndexes();
                g.writeArray(acked, 0, acked.length);
                g.writeEndObject();
            }
            g.writeEndArray();
            g.writeBooleanField("truncated", view.truncated());
            g.writeEndObject();
        }
    }

    static void writeDigests(Writer out, String broker, List<String> brokers, String namespace,
                             List<CursorDigests.TopicDigest> topics) throws IOException {
        try (JsonGenerator g = JSON.createGenerator(out)) {
            g.writeStartObject();
            writeBrokers(g, broker, brokers, namespace);
            g.writeArrayFieldStart("topics");
            for (CursorDigests.TopicDigest t : topics) {
                g.writeStartObject();
                g.writeStringField("topic", t.topic());
                g.writeStringField("ledgers", t.ledgers());
                g.writeObjectFieldStart("cursors");
                for (Map.Entry<String, CursorDigests.Digest> c : t.cursors().entrySet()) {
                    g.writeObjectFieldStart(c.getKey());
                    g.writeStringField("acks", c.getValue().acks());
                    g.writeStringField("batches", c.getValue().batches());
                    g.writeEndObject();
                }
                g.writeEndObject();
                if (t.stats() != null) {
                    writeStats(g, t.stats());
                }
                g.writeEndObject();
            }
            g.writeEndArray();
            g.writeEndObject();
        }
    }

    static void writeDispatchable(Writer out, String broker, List<String> brokers,
                                  String namespace, List<Dispatchable.TopicPosition> topics)
            throws IOException {
        try (JsonGenerator g = JSON.createGenerator(out)) {
            g.writeStartObject();
            writeBrokers(g, broker, brokers, namespace);
            g.writeArrayFieldStart("topics");
            for (Dispatchable.TopicPosition t : topics) {
                g.writeStartObject();
                g.writeStringField("topic", t.topic());
                g.writeStringField("dispatchable", text(t.position()));
                g.writeEndObject();
            }
            g.writeEndArray();
            g.writeEndObject();
        }
    }

    static void writeMarkers(Writer out, String topic, Markers.Found found) throws IOException {
        try (JsonGenerator g = JSON.createGenerator(out)) {
            g.writeStartObject();
            g.writeStringField("plugin", PLUGIN);
            g.writeStringField("topic", topic);
            writePositions(g, "markers", found.markers());
            writePositions(g, "missing", found.missing());
            g.writeEndObject();
        }
    }

    private static void writePositions(JsonGenerator g, String field, List<Position> positions)
            throws IOException {
        g.writeArrayFieldStart(field);
        for (Position p : positions) {
            g.writeString(text(p));
        }
        g.writeEndArray();
    }

    /** "plugin", "broker", "brokers" and "namespace": the head of a per-namespace answer. */
    private static void writeBrokers(JsonGenerator g, String broker, List<String> brokers,
                                     String namespace) throws IOException {
        g.writeStringField("plugin", PLUGIN);
        g.writeStringField("broker", broker);
        g.writeArrayFieldStart("brokers");
        for (String b : brokers) {
            g.writeString(b);
        }
        g.writeEndArray();
        g.writeStringField("namespace", namespace);
    }

    /** "stats": the fields of internalStats that {@link CursorDigests.Stats} holds. */
    private static void writeStats(JsonGenerator g, CursorDigests.Stats stats)
            throws IOException {
        g.writeObjectFieldStart("stats");
        g.writeNumberField("numberOfEntries", stats.entries());
        g.writeNumberField("totalSize", stats.size());
        g.writeStringField("lastConfirmedEntry", text(stats.lastConfirmed()));
        g.writeArrayFieldStart("ledgers");
        for (long[] row : stats.ledgers()) {
            g.writeStartObject();
            g.writeNumberField("ledgerId", row[0]);
            g.writeNumberField("entries", row[1]);
            g.writeEndObject();
        }
        g.writeEndArray();
        g.writeObjectFieldStart("cursors");
        for (Map.Entry<String, CursorDigests.CursorText> c : stats.cursors().entrySet()) {
            g.writeObjectFieldStart(c.getKey());
            g.writeStringField("markDeletePosition", text(c.getValue().markDelete()));
            g.writeStringField("individuallyDeletedMessages",
                    c.getValue().individuallyDeleted());
            g.writeEndObject();
        }
        g.writeEndObject();
        g.writeEndObject();
    }

    static void writeError(Writer out, String message) throws IOException {
        try (JsonGenerator g = JSON.createGenerator(out)) {
            g.writeStartObject();
            g.writeStringField("plugin", PLUGIN);
            g.writeStringField("error", message);
            g.writeEndObject();
        }
    }

    /** ledger:entry, the form internalStats uses for positions. */
    static String text(Position p) {
        return p.getLedgerId() + ":" + p.getEntryId();
    }
}
