package cursorsync.broker;

import java.util.concurrent.CompletableFuture;
import org.apache.bookkeeper.mledger.AsyncCallbacks.ReadEntryCallback;
import org.apache.bookkeeper.mledger.Entry;
import org.apache.bookkeeper.mledger.ManagedLedger;
import org.apache.bookkeeper.mledger.ManagedLedgerException;
import org.apache.bookkeeper.mledger.Position;
import org.apache.pulsar.common.api.proto.MessageMetadata;
import org.apache.pulsar.common.protocol.Commands;

/** One entry's metadata, read from the broker's entry cache, else a bookie. */
final class EntryMetadata {

    private EntryMetadata() {
    }

    static CompletableFuture<MessageMetadata> read(ManagedLedger ledger, Position position) {
        CompletableFuture<MessageMetadata> read = new CompletableFuture<>();
        ledger.asyncReadEntry(position, new ReadEntryCallback() {
            @Override
            public void readEntryComplete(Entry entry, Object ctx) {
                try {
                    // Parsed from a duplicate: the entry's buffer may be the cache's.
                    MessageMetadata metadata = new MessageMetadata();
                    Commands.parseMessageMetadata(entry.getDataBuffer().duplicate(), metadata);
                    read.complete(metadata);
                } catch (RuntimeException e) {
                    read.completeExceptionally(e);
                } finally {
                    entry.release();
                }
            }

            @Override
            public void readEntryFailed(ManagedLedgerException e, Object ctx) {
                read.completeExceptionally(e);
            }
        }, null);
        return read;
    }
}
