package cursorsync.broker;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import org.apache.bookkeeper.mledger.Position;
import org.apache.bookkeeper.mledger.PositionFactory;
import org.apache.pulsar.broker.service.BrokerService;
import org.apache.pulsar.broker.service.persistent.PersistentTopic;
import org.apache.pulsar.common.naming.NamespaceName;

/**
 * For every persistent topic of one namespace this broker serves, its last dispatchable
 * position: what the broker answers a consumer's GetLastMessageId with (the last entry
 * that is neither a marker nor an aborted transaction's message, within the transaction
 * buffer's max read position). One request per broker answers for all its topics, where a
 * reader asks one topic per round trip.
 *
 * <p>Only positions the broker knows without reading are listed: the one it keeps up to
 * date as messages are written. A topic whose position is not known yet (just loaded, or
 * its transaction buffer still recovering) is left out, and the broker starts working it
 * out (a backward read past the markers at the topic's end, as a GetLastMessageId would),
 * so a later request finds it. No request waits on a read.
 *
 * <p>A position that names no entry of a ledger the topic still has (its current ledger
 * empty, or its ledger deleted) is listed as -1:-1, as the broker answers a consumer that
 * does not read the compacted topic.
 */
final class Dispatchable {

    /** A topic and its last dispatchable position. */
    record TopicPosition(String topic, Position position) {
    }

    /** What a consumer is told when the last dispatchable position names no entry. */
    static final Position NONE = PositionFactory.create(-1, -1);

    private Dispatchable() {
    }

    static List<TopicPosition> of(BrokerService brokers, NamespaceName namespace) {
        List<TopicPosition> out = new ArrayList<>();
        for (PersistentTopic topic : CursorDigests.loaded(brokers, namespace)) {
            // As ServerCnx answers GetLastMessageId: after the transaction buffer recovered.
            if (!known(topic.checkIfTransactionBufferRecoverCompletely())) {
                continue;
            }
            CompletableFuture<Position> future = topic.getLastDispatchablePosition();
            Position last = known(future) ? future.join() : null;
            if (last != null) {
                boolean entry = last.getEntryId() >= 0
                        && topic.getManagedLedger().getLedgersInfo().containsKey(last.getLedgerId());
                out.add(new TopicPosition(topic.getName(), entry ? last : NONE));
            }
        }
        return out;
    }

    private static boolean known(CompletableFuture<?> future) {
        return future.isDone() && !future.isCompletedExceptionally();
    }
}
