// Sends messages in Pulsar transactions, committed or aborted, for the test bed: the Python
// client has no transactions. Run from source with the distribution's jars:
//   java -cp 'PULSAR_HOME/lib/*' TxnProduce.java SERVICE_URL TOPIC PLAN KEY_PREFIX
// PLAN is comma-separated steps: cN = N messages in a transaction then committed, aN = the
// same aborted, pN = N plain messages. Prints one line per message sent:
//   KEY KIND LEDGER:ENTRY
// (KIND c, a or p), after the step's commit or abort went through.
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.TypedMessageBuilder;
import org.apache.pulsar.client.api.transaction.Transaction;
import org.apache.pulsar.client.impl.MessageIdImpl;

public class TxnProduce {
    public static void main(String[] args) throws Exception {
        String url = args[0], topic = args[1], plan = args[2], prefix = args[3];
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url)
                .enableTransaction(true).operationTimeout(30, TimeUnit.SECONDS).build();
             Producer<byte[]> producer = client.newProducer().topic(topic)
                .enableBatching(false).sendTimeout(0, TimeUnit.SECONDS).create()) {
            int n = 0;
            for (String step : plan.split(",")) {
                char kind = step.charAt(0);
                int count = Integer.parseInt(step.substring(1));
                Transaction txn = kind == 'p' ? null : client.newTransaction()
                        .withTransactionTimeout(5, TimeUnit.MINUTES).build().get();
                List<String> lines = new ArrayList<>();
                for (int i = 0; i < count; i++) {
                    String key = prefix + n++;
                    TypedMessageBuilder<byte[]> msg =
                            txn == null ? producer.newMessage() : producer.newMessage(txn);
                    MessageId id = msg.property("key", key).value(key.getBytes()).send();
                    MessageIdImpl at = (MessageIdImpl) id;
                    lines.add(key + " " + kind + " " + at.getLedgerId() + ":" + at.getEntryId());
                }
                if (kind == 'c') {
                    txn.commit().get();
                } else if (kind == 'a') {
                    txn.abort().get();
                }
                for (String line : lines) {
                    System.out.println(line);
                }
                System.out.flush();
            }
        }
    }
}
