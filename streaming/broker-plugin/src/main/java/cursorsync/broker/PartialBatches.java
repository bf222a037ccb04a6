package cursorsync.broker;

import java.util.ArrayList;
import java.util.BitSet;
import java.util.List;
import java.util.NavigableMap;
import java.util.concurrent.CompletableFuture;
import org.apache.bookkeeper.mledger.ManagedCursor;
import org.apache.bookkeeper.mledger.ManagedLedger;
import org.apache.bookkeeper.mledger.Position;
import org.apache.bookkeeper.mledger.impl.ManagedCursorImpl;

/**
 * Reads, from a durable cursor, every entry whose batch is partly acked.
 *
 * <p>Pulsar 4.0 keeps them in ManagedCursorImpl's batchDeletedIndexes (a sorted map from
 * position to the BitSet of indexes not acked yet; null when the broker's
 * acknowledgmentAtBatchIndexLevelEnabled is off). No interface method lists its keys, so this
 * takes them from ManagedCursorImpl.getBatchDeletedIndexes() and each one's words through the
 * interface's getDeletedBatchIndexesAsLongArray, which answers null for one acked meanwhile.
 * Like Pulsar's own dispatchers, it reads them without the cursor's lock (that lock is
 * private): an ack landing during the scan may or may not show in the answer.
 *
 * <p>The batch size comes from the entry's metadata: one entry read per partly acked batch
 * (from the broker's entry cache, else a bookie), all issued at once, at most {@code limit}.
 * A caller pages through more with {@code after}: the batches after that position.
 */
final class PartialBatches {

    /** What the answer says of one cursor. */
    record CursorView(Position markDelete, boolean batchIndexAcks, List<PartialBatch> batches,
                      boolean truncated) {
    }

    private PartialBatches() {
    }

    static CursorView read(ManagedLedger ledger, ManagedCursor cursor, int limit,
                           Position after, long timeoutSeconds, String what) {
        Position markDelete = cursor.getMarkDeletedPosition();
        if (!(cursor instanceof ManagedCursorImpl impl)) {
            throw new HttpProblem(501, what + ": cursor of type " + cursor.getClass().getName()
                    + " keeps no batch indexes this plugin can read");
        }
        NavigableMap<Position, BitSet> kept = impl.getBatchDeletedIndexes();
        if (kept == null) {
            return new CursorView(markDelete, false, List.of(), false);
        }
        List<Position> positions = new ArrayList<>();
        List<long[]> ackSets = new ArrayList<>();
        boolean truncated = false;
        for (Position position : after == null ? kept.keySet()
                : kept.tailMap(after, false).keySet()) {
            long[] words = cursor.getDeletedBatchIndexesAsLongArray(position);
            if (words == null || words.length == 0 || cursor.isMessageDeleted(position)) {
                continue; // acked whole (or below markDelete) since the scan began
            }
            if (positions.size() == limit) {
                truncated = true;
                break;
            }
            positions.add(position);
            ackSets.add(words);
        }
        List<CompletableFuture<Integer>> sizes = positions.stream()
                .map(p -> batchSize(ledger, p)).toList();
        List<PartialBatch> batches = new ArrayList<>(positions.size());
        for (int i = 0; i < positions.size(); i++) {
            int size = Waits.await(sizes.get(i), timeoutSeconds,
                    what + ": reading entry " + positions.get(i) + " for its batch size");
            batches.add(new PartialBatch(positions.get(i), ackSets.get(i), size));
        }
        return new CursorView(markDelete, true, batches, truncated);
    }

    private static CompletableFuture<Integer> batchSize(ManagedLedger ledger, Position position) {
        return EntryMetadata.read(ledger, position)
                .thenApply(m -> m.hasNumMessagesInBatch() ? m.getNumMessagesInBatch() : 1);
    }
}
