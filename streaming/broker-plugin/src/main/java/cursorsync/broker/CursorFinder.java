package cursorsync.broker;

import java.net.URL;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.function.Function;
import org.apache.bookkeeper.mledger.ManagedCursor;
import org.apache.pulsar.broker.PulsarService;
import org.apache.pulsar.broker.authentication.AuthenticationDataSource;
import org.apache.pulsar.broker.authorization.AuthorizationService;
import org.apache.pulsar.broker.loadbalance.LoadManager;
import org.apache.pulsar.broker.namespace.LookupOptions;
import org.apache.pulsar.broker.namespace.NamespaceService;
import org.apache.pulsar.broker.service.BrokerService;
import org.apache.pulsar.broker.service.Topic;
import org.apache.pulsar.broker.service.persistent.PersistentSubscription;
import org.apache.pulsar.broker.service.persistent.PersistentTopic;
import org.apache.pulsar.common.naming.NamespaceName;
import org.apache.pulsar.common.naming.TopicName;
import org.apache.pulsar.common.policies.data.NamespaceOperation;
import org.apache.pulsar.common.policies.data.TopicOperation;

/**
 * From a topic and subscription name to the subscription's cursor on this broker, with the
 * checks Pulsar's own admin API makes for internalStats: the caller may read the topic's
 * stats, this broker owns the topic (else {@link Redirect} to its owner), the topic and the
 * subscription exist. Nothing here creates a topic or a subscription.
 */
final class CursorFinder {

    /** A subscription's cursor and the topic whose managed ledger holds its entries. */
    record Found(PersistentTopic topic, String subscription, ManagedCursor cursor) {
    }

    private final PulsarService pulsar;

    CursorFinder(PulsarService pulsar) {
        this.pulsar = pulsar;
    }

    long timeoutSeconds() {
        return pulsar.getConfiguration().getMetadataStoreOperationTimeoutSeconds();
    }

    Found find(String topicText, String subscription, Caller caller) {
        TopicName name = parse(topicText);
        authorize(name, caller, TopicOperation.GET_STATS,
                "read the stats of " + name + " (GET_STATS, as internalStats requires)");
        checkOwnedHere(name, caller);
        PersistentTopic topic = load(name);
        PersistentSubscription sub = topic.getSubscription(subscription);
        if (sub == null) {
            throw new HttpProblem(404, "subscription " + subscription + " not found on topic "
                    + name + " (owned by this broker)");
        }
        return new Found(topic, subscription, sub.getCursor());
    }

    /**
     * A topic whose messages the caller may read by position (PEEK_MESSAGES, as the admin
     * API's raw entry read requires), owned by this broker (else {@link Redirect}).
     */
    PersistentTopic peekable(String topicText, Caller caller) {
        TopicName name = parse(topicText);
        authorize(name, caller, TopicOperation.PEEK_MESSAGES,
                "read the messages of " + name + " by position (PEEK_MESSAGES, as the admin "
                        + "API's raw entry read requires)");
        checkOwnedHere(name, caller);
        return load(name);
    }

    BrokerService brokers() {
        return pulsar.getBrokerService();
    }

    String brokerId() {
        return pulsar.getBrokerId();
    }

    /** The cluster's available brokers (their ids, host:web port), sorted. */
    List<String> availableBrokers() {
        LoadManager manager = pulsar.getLoadManager().get();
        if (manager == null) {
            throw new HttpProblem(503, "this broker's load manager has not started yet");
        }
        List<String> out = new ArrayList<>(Waits.await(manager.getAvailableBrokersAsync(),
                timeoutSeconds(), "listing the cluster's available brokers"));
        out.sort(null);
        return out;
    }

    /**
     * A namespace the caller may list the topics of (NamespaceOperation.GET_TOPICS, checked
     * only when authentication and authorization are both on, as Pulsar's admin API does).
     */
    NamespaceName namespace(String text, Caller caller) {
        NamespaceName name;
        try {
            name = NamespaceName.get(text);
        } catch (IllegalArgumentException e) {
            throw new HttpProblem(400, "namespace " + text + " is not a valid namespace name "
                    + "(tenant/namespace): " + e.getMessage());
        }
        if (!authorizing()) {
            return name;
        }
        if (caller.role() == null) {
            throw new HttpProblem(401, "no authenticated role for " + name);
        }
        boolean allowed = Waits.await(pulsar.getBrokerService().getAuthorizationService()
                        .allowNamespaceOperationAsync(name, NamespaceOperation.GET_TOPICS,
                                caller.role(), caller.authData()),
                timeoutSeconds(), "checking role " + caller.role() + " on " + name);
        if (!allowed) {
            throw new HttpProblem(403, "role " + caller.role() + " may not list the topics of "
                    + name + " (GET_TOPICS)");
        }
        return name;
    }

    /**
     * The topics of {@code topics} whose stats the caller may read (GET_STATS, as internalStats
     * requires); the others are left out, as if this broker did not serve them.
     */
    <T> List<T> readable(List<T> topics, Function<T, String> name, Caller caller) {
        if (!authorizing()) {
            return topics;
        }
        AuthorizationService auth = pulsar.getBrokerService().getAuthorizationService();
        List<CompletableFuture<Boolean>> allowed = topics.stream()
                .map(t -> auth.allowTopicOperationAsync(TopicName.get(name.apply(t)),
                        TopicOperation.GET_STATS, caller.role(), caller.authData()))
                .toList();
        List<T> out = new ArrayList<>();
        for (int i = 0; i < topics.size(); i++) {
            if (Waits.await(allowed.get(i), timeoutSeconds(), "checking role " + caller.role()
                    + " on " + name.apply(topics.get(i)))) {
                out.add(topics.get(i));
            }
        }
        return out;
    }

    private boolean authorizing() {
        return pulsar.getConfiguration().isAuthenticationEnabled()
                && pulsar.getConfiguration().isAuthorizationEnabled();
    }

    /** Who asks, as the broker's authentication filter found them (role null: none). */
    record Caller(String role, AuthenticationDataSource authData, boolean https,
                  boolean authoritative) {
    }

    private static TopicName parse(String text) {
        TopicName name;
        try {
            name = TopicName.get(text);
        } catch (IllegalArgumentException e) {
            throw new HttpProblem(400, "topic " + text + " is not a valid topic name: "
                    + e.getMessage());
        }
        if (!name.isPersistent()) {
            throw new HttpProblem(400, "topic " + name + " is not persistent: only persistent "
                    + "topics have cursors");
        }
        return name;
    }

    private void authorize(TopicName name, Caller caller, TopicOperation operation,
                           String doing) {
        // As PulsarWebResource.validateTopicOperationAsync: checked only when both are on.
        if (!authorizing()) {
            return;
        }
        if (caller.role() == null) {
            throw new HttpProblem(401, "no authenticated role for " + name);
        }
        boolean allowed = Waits.await(pulsar.getBrokerService().getAuthorizationService()
                        .allowTopicOperationAsync(name, operation, caller.role(),
                                caller.authData()),
                timeoutSeconds(), "checking role " + caller.role() + " on " + name);
        if (!allowed) {
            throw new HttpProblem(403, "role " + caller.role() + " may not " + doing);
        }
    }

    private void checkOwnedHere(TopicName name, Caller caller) {
        // As PulsarWebResource.validateTopicOwnershipAsync: look the owner up (this may take an
        // unowned bundle here), then redirect unless this broker is it.
        NamespaceService ns = pulsar.getNamespaceService();
        LookupOptions options = LookupOptions.builder().authoritative(caller.authoritative())
                .requestHttps(caller.https()).readOnly(false).loadTopicsInBundle(false).build();
        Optional<URL> owner = Waits.await(ns.getWebServiceUrlAsync(name, options),
                timeoutSeconds(), "looking up the owner of " + name);
        if (owner.isEmpty()) {
            throw new HttpProblem(503, "no broker owns " + name + " right now; ask again");
        }
        boolean here = Waits.await(ns.isServiceUnitOwnedAsync(name), timeoutSeconds(),
                "checking this broker owns " + name);
        if (!here) {
            throw new Redirect(owner.get());
        }
    }

    private PersistentTopic load(TopicName name) {
        Optional<Topic> topic = Waits.await(
                pulsar.getBrokerService().getTopicIfExists(name.toString()), timeoutSeconds(),
                "loading " + name);
        if (topic.isEmpty()) {
            throw new HttpProblem(404, "topic " + name + " not found (a partitioned topic is "
                    + "asked partition by partition: " + name + "-partition-0, ...)");
        }
        if (!(topic.get() instanceof PersistentTopic persistent)) {
            throw new HttpProblem(400, "topic " + name + " is not a persistent topic");
        }
        return persistent;
    }
}
