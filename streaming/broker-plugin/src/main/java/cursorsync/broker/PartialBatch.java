package cursorsync.broker;

import java.util.BitSet;
import org.apache.bookkeeper.mledger.Position;

/**
 * One entry whose batch the cursor holds as partly acked.
 *
 * @param ackSet    the cursor's words for it, as ManagedCursor.getDeletedBatchIndexesAsLongArray
 *                  gives them: bit i set means index i is NOT acked yet (Pulsar's ack-set
 *                  convention; the cursor ANDs each ack into it and drops it once empty)
 * @param batchSize how many messages the entry holds (its metadata's num_messages_in_batch):
 *                  the words alone cannot tell acked tail indexes from indexes never there
 */
record PartialBatch(Position position, long[] ackSet, int batchSize) {

    /** The indexes below batchSize whose bit is clear: the acked ones. */
    int[] ackedIndexes() {
        BitSet unacked = BitSet.valueOf(ackSet);
        return java.util.stream.IntStream.range(0, batchSize)
                .filter(i -> !unacked.get(i)).toArray();
    }
}
