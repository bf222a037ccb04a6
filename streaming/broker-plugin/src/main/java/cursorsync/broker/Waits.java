package cursorsync.broker;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * Waits on the broker's futures from a web thread, bounded: a lookup or a read that does not
 * finish becomes a 503 naming what was being done, never a thread held for good.
 */
final class Waits {

    private Waits() {
    }

    static <T> T await(CompletableFuture<T> future, long timeoutSeconds, String doing) {
        try {
            return future.get(timeoutSeconds, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
            throw new HttpProblem(503, doing + ": no answer within " + timeoutSeconds + " s");
        } catch (ExecutionException e) {
            Throwable cause = e.getCause() == null ? e : e.getCause();
            throw new HttpProblem(503, doing + " failed: " + cause);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new HttpProblem(503, doing + ": interrupted (the broker is stopping)");
        }
    }
}
