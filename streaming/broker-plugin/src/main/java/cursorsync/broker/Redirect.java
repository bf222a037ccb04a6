package cursorsync.broker;

import java.net.URL;

/**
 * The topic is owned by another broker, at {@code owner} (its web service URL): the servlet
 * answers 307 to the same request there, as Pulsar's admin API does for a topic it does not own.
 */
final class Redirect extends RuntimeException {

    final URL owner;

    Redirect(URL owner) {
        super("owned by " + owner, null, false, false);
        this.owner = owner;
    }
}
