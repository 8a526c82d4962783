// Runs Kroxylicious from a YAML config file: the job of io.kroxylicious.app.Kroxylicious
// (kroxylicious-app), which is not on Maven Central. Java's source launcher runs it:
//   java -cp 'KROXYLICIOUS_LIB/*' tools/apache-kafka/KroxyliciousMain.java proxy.yaml
import io.kroxylicious.proxy.KafkaProxy;
import io.kroxylicious.proxy.config.ConfigParser;
import io.kroxylicious.proxy.config.Configuration;
import io.kroxylicious.proxy.internal.config.Features;
import java.nio.file.Files;
import java.nio.file.Path;

public class KroxyliciousMain {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: KroxyliciousMain CONFIG.yaml");
            System.exit(2);
        }
        ConfigParser parser = new ConfigParser();
        Configuration config = parser.parseConfiguration(Files.readString(Path.of(args[0])));
        try (KafkaProxy proxy = new KafkaProxy(parser, config, Features.defaultFeatures())) {
            proxy.startup();
            proxy.block();
        }
    }
}
