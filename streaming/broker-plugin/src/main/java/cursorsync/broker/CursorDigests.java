package cursorsync.broker;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.Set;
import org.apache.bookkeeper.mledger.ManagedCursor;
import org.apache.bookkeeper.mledger.ManagedLedger;
import org.apache.bookkeeper.mledger.Position;
import org.apache.bookkeeper.mledger.impl.ManagedCursorImpl;
import org.apache.pulsar.broker.service.BrokerService;
import org.apache.pulsar.broker.service.Topic;
import org.apache.pulsar.broker.service.persistent.PersistentSubscription;
import org.apache.pulsar.broker.service.persistent.PersistentTopic;
import org.apache.pulsar.common.naming.NamespaceName;

/**
 * For every persistent topic of one namespace this broker serves, a line that changes with
 * every entry added or ledger trimmed (as the topic stats' counters do), and for each durable subscription a digest that
 * changes with every change of its cursor's acknowledgements: one request per broker tells a
 * poller which partitions' cursors moved, where topic stats take one request per topic and
 * a read of every partition's stats inside the broker.
 *
 * <p>A cursor has two digests, 64-bit hashes: of its individually deleted ranges and
 * markDeletePosition, read together under the cursor's read lock (through
 * processIndividuallyDeletedMessagesAndGetMarkDeletedPosition, the one public method that
 * takes it), and of its partly acked batches' words (read like {@link PartialBatches} does,
 * without the lock). The first is a hash of exactly what internalStats shows of the cursor,
 * so a poller can hash what it read and know the state it holds is the state the broker
 * has, with no race between the two requests. Equal digests mean equal states, but for a
 * hash collision (about one in 2^64 per change). A digest says nothing else.
 */
final class CursorDigests {

    /** One topic: its ledgers line and its durable subscriptions' digests, by name. */
    record TopicDigest(String topic, String ledgers, Map<String, Digest> cursors) {
    }

    private CursorDigests() {
    }

    /**
     * The topics of {@code namespace} loaded on this broker, in name order; of each, the
     * subscriptions named in {@code subscriptions} (empty: every durable one).
     */
    static List<TopicDigest> of(BrokerService brokers, NamespaceName namespace,
                                Set<String> subscriptions) {
        Map<String, Map<String, Topic>> bundles =
                brokers.getMultiLayerTopicsMap().get(namespace.toString());
        List<PersistentTopic> topics = new ArrayList<>();
        if (bundles != null) {
            for (Map<String, Topic> bundle : bundles.values()) {
                for (Topic topic : bundle.values()) {
                    if (topic instanceof PersistentTopic persistent) {
                        topics.add(persistent);
                    }
                }
            }
        }
        topics.sort(Comparator.comparing(PersistentTopic::getName));
        List<TopicDigest> out = new ArrayList<>(topics.size());
        for (PersistentTopic topic : topics) {
            out.add(new TopicDigest(topic.getName(), ledgers(topic.getManagedLedger()),
                    cursors(topic.getSubscriptions().values(), subscriptions)));
        }
        return out;
    }

    /**
     * entries : bytes : last confirmed entry (ledger:entry), over the ledgers the topic keeps:
     * an entry added moves the last, a ledger trimmed lowers the first two.
     */
    static String ledgers(ManagedLedger ledger) {
        Position last = ledger.getLastConfirmedEntry();
        return ledger.getNumberOfEntries() + ":" + ledger.getTotalSize() + ":"
                + last.getLedgerId() + ":" + last.getEntryId();
    }

    private static Map<String, Digest> cursors(Collection<PersistentSubscription> subs,
                                               Set<String> wanted) {
        Map<String, Digest> out = new LinkedHashMap<>();
        subs.stream()
                .filter(s -> wanted.isEmpty() || wanted.contains(s.getName()))
                .filter(s -> s.getCursor() != null && s.getCursor().isDurable())
                .sorted(Comparator.comparing(PersistentSubscription::getName))
                .forEach(s -> out.put(s.getName(), digest(s.getCursor())));
        return out;
    }

    /** A cursor's two digests, as 16 hex digits each. */
    record Digest(String acks, String batches) {
    }

    /**
     * The cursor's digests: of its acknowledgements (each individually deleted range's
     * lower and upper ledger and entry, in order, then the markDeletePosition's), and of its
     * partly acked batches (each one's ledger, entry, word count and words).
     */
    static Digest digest(ManagedCursor cursor) {
        if (!(cursor instanceof ManagedCursorImpl impl)) {
            // Not the implementation 4.0 uses: its ranges cannot be read under the lock.
            throw new HttpProblem(501, "cursor " + cursor.getName() + " is a "
                    + cursor.getClass().getName() + ", whose acknowledgements this plugin "
                    + "cannot read");
        }
        Hash acks = new Hash();
        Position markDelete = impl.processIndividuallyDeletedMessagesAndGetMarkDeletedPosition(
                r -> {
                    acks.add(r.lowerEndpoint().getLedgerId());
                    acks.add(r.lowerEndpoint().getEntryId());
                    acks.add(r.upperEndpoint().getLedgerId());
                    acks.add(r.upperEndpoint().getEntryId());
                    return true;
                });
        acks.add(markDelete.getLedgerId());
        acks.add(markDelete.getEntryId());
        Hash batches = new Hash();
        NavigableMap<Position, ?> kept = impl.getBatchDeletedIndexes();
        if (kept != null) {
            for (Position p : kept.keySet()) {
                long[] words = cursor.getDeletedBatchIndexesAsLongArray(p);
                if (words == null) {
                    continue; // acked whole since the scan began
                }
                batches.add(p.getLedgerId());
                batches.add(p.getEntryId());
                batches.add(words.length);
                for (long w : words) {
                    batches.add(w);
                }
            }
        }
        return new Digest(acks.hex(), batches.hex());
    }

    /** A 64-bit hash of a sequence of longs (splitmix64's finalizer after each one). */
    static final class Hash {
        private long value = 0x9E3779B97F4A7C15L;

        void add(long v) {
            long z = value ^ (v + 0x9E3779B97F4A7C15L);
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            value = z ^ (z >>> 31);
        }

        String hex() {
            return String.format("%016x", value);
        }
    }
}
