package cursorsync.broker;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import org.apache.bookkeeper.mledger.ManagedLedger;
import org.apache.bookkeeper.mledger.Position;
import org.apache.bookkeeper.mledger.proto.MLDataFormats.ManagedLedgerInfo.LedgerInfo;
import org.apache.pulsar.common.api.proto.MessageMetadata;

/**
 * Which of some entries of a topic are markers (their metadata names a marker type, as the
 * admin API's raw-entry answer shows in its X-Pulsar-marker-type header), and which the
 * topic does not hold (a ledger it no longer keeps, an entry past a ledger's end): one
 * request for many entries where the admin API takes one each. The entries are read at
 * once, from the broker's entry cache or a bookie.
 */
final class MarkerEntries {

    /** Most entries one request may name. */
    static final int MAX_ENTRIES = 1000;

    /** The markers among the entries asked, and those the topic does not hold. */
    record Answer(List<Position> markers, List<Position> missing) {
    }

    private MarkerEntries() {
    }

    static Answer read(ManagedLedger ledger, List<Position> positions, long timeoutSeconds,
                       String what) {
        List<Position> held = new ArrayList<>();
        List<Position> missing = new ArrayList<>();
        for (Position p : positions) {
            (holds(ledger, p) ? held : missing).add(p);
        }
        List<CompletableFuture<Boolean>> reads = held.stream()
                .map(p -> EntryMetadata.read(ledger, p, MessageMetadata::hasMarkerType))
                .toList();
        List<Position> markers = new ArrayList<>();
        for (int i = 0; i < held.size(); i++) {
            if (Waits.await(reads.get(i), timeoutSeconds,
                    what + ": reading entry " + PluginJson.text(held.get(i)))) {
                markers.add(held.get(i));
            }
        }
        return new Answer(markers, missing);
    }

    /**
     * Whether the topic holds the entry: its ledger is kept, and the entry is at or before
     * the last confirmed one in that ledger (the open or last written one) or within a
     * closed ledger's count.
     */
    static boolean holds(ManagedLedger ledger, Position p) {
        LedgerInfo info = ledger.getLedgersInfo().get(p.getLedgerId());
        Position last = ledger.getLastConfirmedEntry();
        if (info == null || p.getEntryId() < 0 || p.getLedgerId() > last.getLedgerId()) {
            return false;
        }
        return p.getLedgerId() == last.getLedgerId() ? p.getEntryId() <= last.getEntryId()
                : p.getEntryId() < info.getEntries();
    }
}
