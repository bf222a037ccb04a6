package cursorsync.broker;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import java.io.IOException;
import java.io.Writer;
import org.apache.bookkeeper.mledger.Position;

/**
 * The endpoint's JSON, written with the broker's own jackson-core. Every answer, errors
 * included, says {"plugin": "cursorsync"}: a 404 without it is the broker saying the plugin
 * is not loaded, one with it is the plugin saying the topic or subscription is unknown.
 */
final class BatchAcksJson {

    static final String PLUGIN = "cursorsync";
    private static final JsonFactory JSON = new JsonFactory();

    private BatchAcksJson() {
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

    static void writeError(Writer out, String message) throws IOException {
        try (JsonGenerator g = JSON.createGenerator(out)) {
            g.writeStartObject();
            g.writeStringField("plugin", PLUGIN);
            g.writeStringField("error", message);
            g.writeEndObject();
        }
    }

    /** ledger:entry, the form internalStats uses for positions. */
    private static String text(Position p) {
        return p.getLedgerId() + ":" + p.getEntryId();
    }
}
