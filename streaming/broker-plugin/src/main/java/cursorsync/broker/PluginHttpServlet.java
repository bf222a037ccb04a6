package cursorsync.broker;

import java.io.IOException;
import java.net.URL;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.stream.Collectors;
import javax.servlet.http.HttpServlet;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;
import org.apache.bookkeeper.mledger.Position;
import org.apache.bookkeeper.mledger.PositionFactory;
import org.apache.pulsar.broker.authentication.AuthenticationDataSource;
import org.apache.pulsar.broker.service.persistent.PersistentTopic;
import org.apache.pulsar.broker.web.AuthenticationFilter;
import org.apache.pulsar.common.naming.NamespaceName;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The HTTP side only (parameters, status codes, redirects) of the plugin's two endpoints:
 * GET /cursorsync/batch-acks?topic=T&amp;subscription=S[&amp;limit=N][&amp;after=L:E] (the work is
 * {@link CursorFinder}'s and {@link PartialBatches}') and
 * GET /cursorsync/cursors?namespace=TENANT/NS[&amp;subscription=S...][&amp;stats=true]
 * ({@link CursorDigests}'), GET /cursorsync/dispatchable?namespace=TENANT/NS
 * ({@link Dispatchable}'s) and GET /cursorsync/markers?topic=T&amp;entries=L:E[-E2],...
 * ({@link Markers}').
 * Read-only: no method but GET is served.
 */
final class PluginHttpServlet extends HttpServlet {

    static final String PATH = "/batch-acks";
    static final String CURSORS_PATH = "/cursors";
    static final String DISPATCHABLE_PATH = "/dispatchable";
    static final String MARKERS_PATH = "/markers";
    /** Entries one markers request may ask about, runs expanded. */
    static final int MAX_ENTRIES = 1000;
    static final int DEFAULT_LIMIT = 1000;
    static final int MAX_LIMIT = 100_000;
    private static final Logger LOG = LoggerFactory.getLogger(PluginHttpServlet.class);

    private final transient CursorFinder finder;

    PluginHttpServlet(CursorFinder finder) {
        this.finder = finder;
    }

    @Override
    protected void doGet(HttpServletRequest req, HttpServletResponse resp) throws IOException {
        try {
            if (CURSORS_PATH.equals(req.getPathInfo())) {
                cursors(req, resp);
                return;
            }
            if (DISPATCHABLE_PATH.equals(req.getPathInfo())) {
                dispatchable(req, resp);
                return;
            }
            if (MARKERS_PATH.equals(req.getPathInfo())) {
                markers(req, resp);
                return;
            }
            if (!PATH.equals(req.getPathInfo())) {
                throw new HttpProblem(404, "no such endpoint; this plugin answers GET "
                        + CursorSyncServlet.BASE_PATH + PATH + "?topic=...&subscription=... and "
                        + CursorSyncServlet.BASE_PATH + CURSORS_PATH + "?namespace=... and "
                        + CursorSyncServlet.BASE_PATH + DISPATCHABLE_PATH + "?namespace=... and "
                        + CursorSyncServlet.BASE_PATH + MARKERS_PATH + "?topic=...&entries=...");
            }
            String topic = required(req, "topic");
            String subscription = required(req, "subscription");
            int limit = limit(req.getParameter("limit"));
            Position after = after(req.getParameter("after"));
            CursorFinder.Found found = finder.find(topic, subscription, caller(req));
            String name = found.topic().getName();
            PartialBatches.CursorView view = PartialBatches.read(
                    found.topic().getManagedLedger(), found.cursor(), limit, after,
                    finder.timeoutSeconds(), "subscription " + subscription + " of " + name);
            resp.setStatus(200);
            resp.setContentType("application/json");
            PluginJson.writeView(resp.getWriter(), name, subscription, view);
        } catch (Redirect r) {
            resp.setStatus(307);
            resp.setHeader("Location", redirect(req, r.owner));
        } catch (HttpProblem p) {
            error(resp, p.status, p.getMessage());
        } catch (LinkageError e) {
            // A broker whose classes are not those this NAR was compiled against (4.0.8).
            LOG.warn("cursorsync plugin {}: this broker's classes differ from 4.0's",
                    req.getPathInfo(), e);
            error(resp, 501, "this plugin was built against Pulsar 4.0 and this broker's "
                    + "classes differ: " + e);
        } catch (RuntimeException e) {
            LOG.warn("cursorsync plugin {}?{} failed", req.getPathInfo(), req.getQueryString(),
                    e);
            error(resp, 500, "unexpected: " + e);
        }
    }

    /** GET /cursorsync/cursors: answered for the topics this broker serves; no redirect. */
    private void cursors(HttpServletRequest req, HttpServletResponse resp) throws IOException {
        NamespaceName namespace = finder.namespace(required(req, "namespace"), caller(req));
        String[] subs = req.getParameterValues("subscription");
        Set<String> wanted = subs == null ? Set.of() : new HashSet<>(Arrays.asList(subs));
        List<CursorDigests.TopicDigest> topics = finder.readable(
                CursorDigests.of(finder.brokers(), namespace, wanted,
                        Boolean.parseBoolean(req.getParameter("stats"))),
                CursorDigests.TopicDigest::topic, caller(req));
        resp.setStatus(200);
        resp.setContentType("application/json");
        PluginJson.writeDigests(resp.getWriter(), finder.brokerId(), finder.availableBrokers(),
                namespace.toString(), topics);
    }

    /** GET /cursorsync/dispatchable: answered for the topics this broker serves; no redirect. */
    private void dispatchable(HttpServletRequest req, HttpServletResponse resp)
            throws IOException {
        NamespaceName namespace = finder.namespace(required(req, "namespace"), caller(req));
        List<Dispatchable.TopicPosition> topics = finder.readable(
                Dispatchable.of(finder.brokers(), namespace), Dispatchable.TopicPosition::topic,
                caller(req));
        resp.setStatus(200);
        resp.setContentType("application/json");
        PluginJson.writeDispatchable(resp.getWriter(), finder.brokerId(),
                finder.availableBrokers(), namespace.toString(), topics);
    }

    /** GET /cursorsync/markers: answered by the topic's owner (else a redirect to it). */
    private void markers(HttpServletRequest req, HttpServletResponse resp) throws IOException {
        List<Position> positions = entries(required(req, "entries"));
        PersistentTopic topic = finder.peekable(required(req, "topic"), caller(req));
        Markers.Found found = Markers.among(topic.getManagedLedger(), positions,
                finder.timeoutSeconds(), "markers of " + topic.getName());
        resp.setStatus(200);
        resp.setContentType("application/json");
        PluginJson.writeMarkers(resp.getWriter(), topic.getName(), found);
    }

    /**
     * The entries asked, as a comma-separated list of ledger:entry and ledger:first-last (a
     * run of entries of one ledger, both ends included): the sync asks about runs, and a URL
     * of one id each would pass the broker's request header limit long before a run does.
     */
    static List<Position> entries(String text) {
        List<Position> out = new ArrayList<>();
        for (String item : text.split(",", -1)) {
            int dash = item.indexOf('-', item.indexOf(':') + 2);
            Position first = position("entries", dash < 0 ? item : item.substring(0, dash));
            long last = first.getEntryId();
            if (dash >= 0) {
                try {
                    last = Long.parseLong(item.substring(dash + 1));
                } catch (NumberFormatException e) {
                    throw new HttpProblem(400, "entries " + item + ": expected ledger:first-last");
                }
                if (last < first.getEntryId()) {
                    throw new HttpProblem(400, "entries " + item + ": the run ends before it "
                            + "begins");
                }
            }
            if (last - first.getEntryId() + 1 > MAX_ENTRIES - out.size()) {
                throw new HttpProblem(400, "more than " + MAX_ENTRIES + " entries asked: at "
                        + "most " + MAX_ENTRIES + " a request");
            }
            for (long e = first.getEntryId(); e <= last; e++) {
                out.add(PositionFactory.create(first.getLedgerId(), e));
            }
        }
        return out;
    }

    private static String required(HttpServletRequest req, String name) {
        String value = req.getParameter(name);
        if (value == null || value.isBlank()) {
            throw new HttpProblem(400, "query parameter " + name + " is required");
        }
        return value;
    }

    private static int limit(String text) {
        if (text == null) {
            return DEFAULT_LIMIT;
        }
        try {
            int limit = Integer.parseInt(text);
            if (limit >= 1 && limit <= MAX_LIMIT) {
                return limit;
            }
        } catch (NumberFormatException e) {
            // answered below
        }
        throw new HttpProblem(400, "limit " + text + ": expected a whole number from 1 to "
                + MAX_LIMIT);
    }

    /** The position a page starts after (null: from the first), as "ledger:entry". */
    private static Position after(String text) {
        return text == null ? null : position("after", text);
    }

    private static Position position(String parameter, String text) {
        String[] parts = text.split(":", -1);
        try {
            if (parts.length == 2) {
                return PositionFactory.create(Long.parseLong(parts[0]), Long.parseLong(parts[1]));
            }
        } catch (NumberFormatException e) {
            // answered below
        }
        throw new HttpProblem(400, parameter + " " + text + ": expected a position "
                + "ledger:entry");
    }

    private static CursorFinder.Caller caller(HttpServletRequest req) {
        Object role = req.getAttribute(AuthenticationFilter.AuthenticatedRoleAttributeName);
        Object data = req.getAttribute(AuthenticationFilter.AuthenticatedDataAttributeName);
        return new CursorFinder.Caller(role instanceof String s ? s : null,
                data instanceof AuthenticationDataSource d ? d : null, req.isSecure(),
                Boolean.parseBoolean(req.getParameter("authoritative")));
    }

    /** The same request at the owner's web address, marked authoritative as Pulsar's are. */
    private static String redirect(HttpServletRequest req, URL owner) {
        String query = req.getQueryString() == null ? "" : Arrays.stream(
                        req.getQueryString().split("&"))
                .filter(p -> !p.startsWith("authoritative="))
                .collect(Collectors.joining("&"));
        String tail = (query.isEmpty() ? "" : query + "&") + "authoritative=true";
        return owner.getProtocol() + "://" + owner.getAuthority() + req.getRequestURI() + "?"
                + tail;
    }

    private static void error(HttpServletResponse resp, int status, String message)
            throws IOException {
        resp.setStatus(status);
        resp.setContentType("application/json");
        PluginJson.writeError(resp.getWriter(), message);
    }
}
