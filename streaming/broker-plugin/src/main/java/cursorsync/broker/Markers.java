package cursorsync.broker;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import org.apache.bookkeeper.mledger.ManagedLedger;
import org.apache.bookkeeper.mledger.Position;
import org.apache.bookkeeper.mledger.proto.MLDataFormats.ManagedLedgerInfo.LedgerInfo;
import org.apache.pulsar.common.api.proto.MessageMetadata;

/**
 * Which of some entries of one topic partition are markers (their metadata names a marker
 * type: a replicated subscription's snapshot or update, a transaction's commit or abort), as
 * the admin API's raw entry read would tell entry by entry.
 *
 * <p>An entry the topic does not store (its ledger not in the topic's list any more, or its
 * id past the ledger's last entry) is not a marker and is listed as missing; the admin API
 * answers such an id with an error. Every read is issued at once (from the broker's entry cache, else a
 * bookie); one that fails for a stored entry fails the request, naming the entry.
 */
final class Markers {

    /** What the answer says of the entries asked. */
    record Found(List<Position> markers, List<Position> missing) {
    }

    private Markers() {
    }

    static Found among(ManagedLedger ledger, List<Position> positions, long timeoutSeconds,
                       String what) {
        List<Position> stored = new ArrayList<>();
        List<Position> missing = new ArrayList<>();
        Position last = ledger.getLastConfirmedEntry();
        for (Position p : positions) {
            (stored(ledger, last, p) ? stored : missing).add(p);
        }
        List<CompletableFuture<Boolean>> reads = stored.stream()
                .map(p -> isMarker(ledger, p)).toList();
        List<Position> markers = new ArrayList<>();
        for (int i = 0; i < stored.size(); i++) {
            if (Waits.await(reads.get(i), timeoutSeconds,
                    what + ": reading entry " + stored.get(i))) {
                markers.add(stored.get(i));
            }
        }
        return new Found(markers, missing);
    }

    /** Whether the topic stores an entry at {@code p}, by its ledger list. */
    private static boolean stored(ManagedLedger ledger, Position last, Position p) {
        if (p.getEntryId() < 0) {
            return false;
        }
        LedgerInfo info = ledger.getLedgersInfo().get(p.getLedgerId());
        if (info == null) {
            return false;
        }
        if (p.getLedgerId() == last.getLedgerId()) {
            return p.getEntryId() <= last.getEntryId();
        }
        // A closed ledger's count; the current ledger's is 0 in its info until it closes.
        return p.getLedgerId() < last.getLedgerId() && p.getEntryId() < info.getEntries();
    }

    private static CompletableFuture<Boolean> isMarker(ManagedLedger ledger, Position p) {
        return EntryMetadata.read(ledger, p).thenApply(MessageMetadata::hasMarkerType);
    }
}
