import DocumentEngine
import Foundation

extension PostgresStore {
    /// Where a PostgreSQL store is and how to log in: from a `postgres://` URL, with libpq's
    /// environment variables (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`,
    /// `PGSSLMODE`) for what the URL leaves out.
    public struct Configuration: Sendable, Equatable {
        /// A host name or address, or an absolute path: the folder of the server's Unix socket.
        public var host: String
        public var port: Int
        public var user: String
        public var password: String?
        public var database: String
        /// libpq's `sslmode`: `disable`, `allow`, `prefer` (the default), `require`, `verify-ca`
        /// or `verify-full`, with libpq's meaning.
        public var sslMode: String
        /// Whether the connection must use TLS (`sslmode` `require` or stricter).
        public var requireTLS: Bool {
            get { Self.tlsModes.contains(sslMode) }
            set { if newValue != requireTLS { sslMode = newValue ? "require" : "prefer" } }
        }
        /// How long any one request (connecting included) may take before it fails with an
        /// I/O error.
        public var timeout: Duration

        /// libpq's `sslmode` values that may connect without TLS, and those that require it.
        private static let plainModes: Set = ["disable", "allow", "prefer"]
        private static let tlsModes: Set = ["require", "verify-ca", "verify-full"]

        public init(
            host: String = "127.0.0.1", port: Int = 5432, user: String = "postgres", password: String? = nil,
            database: String, requireTLS: Bool = false, timeout: Duration = .seconds(10)
        ) {
            self.host = host
            self.port = port
            self.user = user
            self.password = password
            self.database = database
            self.sslMode = requireTLS ? "require" : "prefer"
            self.timeout = timeout
        }

        /// Whether `text` names a PostgreSQL store (`postgres://` or `postgresql://`).
        public static func isURL(_ text: String) -> Bool {
            text.hasPrefix("postgres://") || text.hasPrefix("postgresql://")
        }

        /// Parses `postgres://[user[:password]@][host][:port][/database][?sslmode=…&host=…]`.
        public init(url text: String, environment: [String: String] = ProcessInfo.processInfo.environment)
            throws
        {
            guard Self.isURL(text), let components = URLComponents(string: text) else {
                throw DocumentStoreError.invalidName(text, reason: "not a postgres:// URL")
            }
            var query: [String: String] = [:]
            for item in components.queryItems ?? [] { query[item.name] = item.value ?? "" }
            func nonEmpty(_ value: String?) -> String? { value.flatMap { $0.isEmpty ? nil : $0 } }
            host =
                nonEmpty(components.percentEncodedHost?.removingPercentEncoding) ?? nonEmpty(query["host"])
                ?? nonEmpty(environment["PGHOST"]) ?? "127.0.0.1"
            if let port = components.port {
                self.port = port
            } else if let text = nonEmpty(query["port"]) ?? nonEmpty(environment["PGPORT"]) {
                guard let port = Int(text), (1...65535).contains(port) else {
                    throw DocumentStoreError.invalidName(text, reason: "not a port number")
                }
                self.port = port
            } else {
                port = 5432
            }
            user =
                nonEmpty(components.user?.removingPercentEncoding) ?? nonEmpty(query["user"])
                ?? nonEmpty(environment["PGUSER"]) ?? nonEmpty(environment["USER"]) ?? "postgres"
            password =
                components.password?.removingPercentEncoding ?? query["password"] ?? environment["PGPASSWORD"]
            let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
            database =
                nonEmpty(path.removingPercentEncoding) ?? nonEmpty(query["dbname"])
                ?? nonEmpty(environment["PGDATABASE"]) ?? user
            let mode = nonEmpty(query["sslmode"]) ?? nonEmpty(environment["PGSSLMODE"]) ?? "prefer"
            guard Self.plainModes.contains(mode) || Self.tlsModes.contains(mode) else {
                throw DocumentStoreError.invalidName(mode, reason: "unknown sslmode")
            }
            sslMode = mode
            if let text = nonEmpty(query["connect_timeout"]), let seconds = Int(text), seconds > 0 {
                timeout = .seconds(seconds)
            } else {
                timeout = .seconds(10)
            }
        }

        /// The store as a URL without its password, for messages and listings.
        public var url: String {
            var components = URLComponents()
            components.scheme = "postgres"
            components.user = user
            if host.hasPrefix("/") {
                components.host = ""
                components.queryItems = [URLQueryItem(name: "host", value: host)]
            } else {
                components.host = host
            }
            components.port = port
            components.path = "/" + database
            return components.string ?? "postgres://\(user)@\(host):\(port)/\(database)"
        }

        /// This configuration for another database on the same server.
        public func with(database: String) -> Configuration {
            var copy = self
            copy.database = database
            return copy
        }

        /// libpq's connection parameters. Only what this configuration names is passed, so
        /// libpq's own defaults and files (`~/.pgpass`, `PGSSLROOTCERT`, …) apply to the rest.
        func connectionParameters() -> [(String, String)] {
            var parameters = [
                ("host", host), ("port", String(port)), ("user", user), ("dbname", database),
                ("sslmode", sslMode), ("application_name", "docfs"),
                // A server that vanished without closing the connection is noticed by the kernel
                // too, not only by the statement timeout.
                ("keepalives", "1"), ("keepalives_idle", "30"), ("keepalives_interval", "10"),
                ("keepalives_count", "3"),
            ]
            if let password { parameters.append(("password", password)) }
            return parameters
        }
    }
}
