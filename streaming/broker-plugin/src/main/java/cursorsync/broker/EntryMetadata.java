package cursorsync.broker;

import java.util.concurrent.CompletableFuture;
import java.util.function.Function;
import org.apache.bookkeeper.mledger.AsyncCallbacks.ReadEntryCallback;
import org.apache.bookkeeper.mledger.Entry;
import org.apache.bookkeeper.mledger.ManagedLedger;
import org.apache.bookkeeper.mledger.ManagedLedgerException;
import org.apache.bookkeeper.mledger.Position;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.protocol.Commands;

/** One entry's message metadata, read from the broker's entry cache or a bookie. */
final class EntryMetadata {

    private EntryMetadata() {
    }

    /** What {@code pick} takes from the metadata of the entry at {@code position}. */
    static <T> CompletableFuture<T> read(ManagedLedger ledger, Position position,
                                         Function<MessageMetadata, T> pick) {
        CompletableFuture<T> out = new CompletableFuture<>();
        ledger.asyncReadEntry(position, new ReadEntryCallback() {
            @Override
            public void readEntryComplete(Entry entry, Object ctx) {
                try {
                    // Parsed from a duplicate: the entry's buffer may be the cache's.
                    MessageMetadata metadata = new MessageMetadata();
                    Commands.parseMessageMetadata(entry.getDataBuffer().duplicate(), metadata);
                    out.complete(pick.apply(metadata));
                } catch (RuntimeException e) {
                    out.completeExceptionally(e);
                } finally {
                    entry.release();
                }
            }

            @Override
            public void readEntryFailed(ManagedLedgerException e, Object ctx) {
                out.completeExceptionally(e);
            }
        }, null);
        return out;
    }
}
