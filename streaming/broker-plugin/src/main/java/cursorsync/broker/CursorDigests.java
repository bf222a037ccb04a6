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
import org.apache.bookkeeper.mledger.proto.MLDataFormats.ManagedLedgerInfo.LedgerInfo;
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
 *
 * <p>Asked for, each topic also comes with its ledgers and the chosen cursors as
 * internalStats shows them ({@link Stats}): one request per broker then reads what one
 * internalStats request per partition would, of those cursors.
 */
final class CursorDigests {

    /**
     * One topic: its ledgers line and its durable subscriptions' digests, by name; and, when
     * asked for, its ledgers and those cursors as internalStats shows them (else null).
     */
    record TopicDigest(String topic, String ledgers, Map<String, Digest> cursors,
                       Stats stats) {
    }

    /**
     * What internalStats shows of a topic's ledgers and of some of its cursors, in its own
     * forms: each cursor's markDeletePosition and individually deleted ranges, then (read
     * after them, so never older) the topic's entry count and size, the last confirmed
     * entry and each kept ledger's id and entry count (0 for the open one, as there: its
     * count is the last confirmed entry's when that is in it, else 0).
     */
    record Stats(Map<String, CursorText> cursors, long entries, long size,
                 Position lastConfirmed, List<long[]> ledgers) {
    }

    /**
     * One cursor as internalStats shows it: the markDeletePosition and the individually
     * deleted ranges ("[(l:e..l:e],...]", each open below and closed above), read together
     * under the cursor's read lock.
     */
    record CursorText(Position markDelete, String individuallyDeleted) {
    }

    private CursorDigests() {
    }

    /**
     * The topics of {@code namespace} loaded on this broker, in name order; of each, the
     * subscriptions named in {@code subscriptions} (empty: every durable one), with their
     * {@link Stats} when {@code stats}.
     */
    static List<TopicDigest> of(BrokerService brokers, NamespaceName namespace,
                                Set<String> subscriptions, boolean stats) {
        List<PersistentTopic> topics = loaded(brokers, namespace);
        List<TopicDigest> out = new ArrayList<>(topics.size());
        for (PersistentTopic topic : topics) {
            ManagedLedger ledger = topic.getManagedLedger();
            String line = ledgers(ledger);
            Map<String, Digest> digests = new LinkedHashMap<>();
            Map<String, CursorText> texts = new LinkedHashMap<>();
            for (PersistentSubscription sub : durable(topic.getSubscriptions().values(),
                    subscriptions)) {
                Read read = read(sub.getCursor(), stats);
                digests.put(sub.getName(), read.digest());
                if (stats) {
                    texts.put(sub.getName(), read.text());
                }
            }
            out.add(new TopicDigest(topic.getName(), line, digests,
                    stats ? stats(ledger, texts) : null));
        }
        return out;
    }

    /** The persistent topics of {@code namespace} loaded on this broker, in name order. */
    static List<PersistentTopic> loaded(BrokerService brokers, NamespaceName namespace) {
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
        return topics;
    }

    private static Stats stats(ManagedLedger ledger, Map<String, CursorText> cursors) {
        long entries = ledger.getNumberOfEntries();
        long size = ledger.getTotalSize();
        Position last = ledger.getLastConfirmedEntry();
        List<long[]> rows = new ArrayList<>();
        for (LedgerInfo info : ledger.getLedgersInfo().values()) {
            rows.add(new long[] {info.getLedgerId(), info.getEntries()});
        }
        return new Stats(cursors, entries, size, last, rows);
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

    private static List<PersistentSubscription> durable(
            Collection<PersistentSubscription> subs, Set<String> wanted) {
        return subs.stream()
                .filter(s -> wanted.isEmpty() || wanted.contains(s.getName()))
                .filter(s -> s.getCursor() != null && s.getCursor().isDurable())
                .sorted(Comparator.comparing(PersistentSubscription::getName))
                .toList();
    }

    /** A cursor's two digests, as 16 hex digits each. */
    record Digest(String acks, String batches) {
    }

    /** A cursor's digests, and what internalStats shows of it when asked for (else null). */
    record Read(Digest digest, CursorText text) {
    }

    /**
     * The cursor's digests: of its acknowledgements (each individually deleted range's
     * lower and upper ledger and entry, in order, then the markDeletePosition's), and of its
     * partly acked batches (each one's ledger, entry, word count and words); with
     * {@code text}, its {@link CursorText} from the same read of the ranges.
     */
    static Read read(ManagedCursor cursor, boolean text) {
        if (!(cursor instanceof ManagedCursorImpl impl)) {
            // Not the implementation 4.0 uses: its ranges cannot be read under the lock.
            throw new HttpProblem(501, "cursor " + cursor.getName() + " is a "
                    + cursor.getClass().getName() + ", whose acknowledgements this plugin "
                    + "cannot read");
        }
        Hash acks = new Hash();
        StringBuilder ranges = text ? new StringBuilder("[") : null;
        Position markDelete = impl.processIndividuallyDeletedMessagesAndGetMarkDeletedPosition(
                r -> {
                    acks.add(r.lowerEndpoint().getLedgerId());
                    acks.add(r.lowerEndpoint().getEntryId());
                    acks.add(r.upperEndpoint().getLedgerId());
                    acks.add(r.upperEndpoint().getEntryId());
                    if (ranges != null) {
                        ranges.append(ranges.length() > 1 ? ",(" : "(")
                                .append(PluginJson.text(r.lowerEndpoint())).append("..")
                                .append(PluginJson.text(r.upperEndpoint())).append(']');
                    }
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
        Digest digest = new Digest(acks.hex(), batches.hex());
        return new Read(digest, ranges == null ? null
                : new CursorText(markDelete, ranges.append(']').toString()));
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
