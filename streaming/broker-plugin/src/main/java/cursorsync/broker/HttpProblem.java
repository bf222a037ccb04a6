package cursorsync.broker;

/**
 * An answer other than 200, with the sentence the caller reads: thrown wherever the request
 * cannot go on, turned into a status and a JSON error by {@link PluginHttpServlet}.
 */
final class HttpProblem extends RuntimeException {

    final int status;

    HttpProblem(int status, String message) {
        super(message, null, false, false); // no stack trace: it is an answer, not a fault
        this.status = status;
    }
}
