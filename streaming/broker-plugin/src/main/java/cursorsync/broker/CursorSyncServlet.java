package cursorsync.broker;

import org.apache.pulsar.broker.PulsarService;
import org.apache.pulsar.broker.web.plugin.servlet.AdditionalServletWithPulsarService;
import org.apache.pulsar.common.configuration.PulsarConfiguration;
import org.eclipse.jetty.servlet.ServletHolder;

/**
 * What the broker loads (named in META-INF/services/additional_servlet.yml): mounts
 * {@link PluginHttpServlet} under {@value #BASE_PATH} on the broker's web port.
 *
 * <p>The broker calls loadConfig, then setPulsarService, then getServletHolder
 * (PulsarService.addBrokerAdditionalServlets, 4.0), so the holder is made last.
 */
public class CursorSyncServlet implements AdditionalServletWithPulsarService {

    static final String BASE_PATH = "/cursorsync";

    private PulsarService pulsar;

    @Override
    public void loadConfig(PulsarConfiguration config) {
        // Nothing to configure: the endpoint reads the broker's own state only.
    }

    @Override
    public void setPulsarService(PulsarService pulsar) {
        this.pulsar = pulsar;
    }

    @Override
    public String getBasePath() {
        return BASE_PATH;
    }

    @Override
    public ServletHolder getServletHolder() {
        return new ServletHolder(new PluginHttpServlet(new CursorFinder(pulsar)));
    }

    @Override
    public void close() {
        // No thread, no file, no connection of its own to release.
    }
}
