import Foundation

/// The iOS sandbox folders of an app, mapped onto the XDG base directories (SB-1, XDG-1..3).
///
/// | iOS | Linux |
/// |---|---|
/// | Documents | `$XDG_DATA_HOME/<app>/Documents` |
/// | Library/Application Support | `$XDG_DATA_HOME/<app>` |
/// | Library/Caches | `$XDG_CACHE_HOME/<app>` |
/// | Library/Preferences | `$XDG_CONFIG_HOME/<app>` |
/// | tmp | `$XDG_RUNTIME_DIR/<app>`, else `$TMPDIR/<app>-<uid>` |
/// | (undo, autosave, state) | `$XDG_STATE_HOME/<app>` |
///
/// XDG variables are honoured only when absolute, as the specification requires; otherwise the
/// defaults `~/.local/share`, `~/.cache`, `~/.config` and `~/.local/state` apply. Folders are
/// created on demand by ``url(for:create:)``, with mode 0700.
public struct SearchPaths: Sendable, Equatable {
    /// The sandbox folders.
    public enum Directory: Sendable, CaseIterable {
        case documents, applicationSupport, caches, preferences, temporary, state
    }

    /// The app identifier, used as the folder name under each base directory.
    public let appID: String
    private let environment: [String: String]

    /// Search paths of `appID`, read from `environment` (the process's by default).
    public init(appID: String, environment: [String: String] = ProcessInfo.processInfo.environment) {
        self.appID = appID
        self.environment = environment
    }

    private var home: URL {
        if let home = absolute("HOME") { return home }
        return URL(fileURLWithPath: NSHomeDirectory(), isDirectory: true)
    }

    private func absolute(_ variable: String) -> URL? {
        guard let value = environment[variable], value.hasPrefix("/") else { return nil }
        return URL(fileURLWithPath: value, isDirectory: true)
    }

    private func base(_ variable: String, _ fallback: String) -> URL {
        absolute(variable) ?? home.appendingPathComponent(fallback, isDirectory: true)
    }

    /// Where the app keeps user documents.
    public var documents: URL { applicationSupport.appendingPathComponent("Documents", isDirectory: true) }
    /// Where the app keeps its own support files.
    public var applicationSupport: URL {
        base("XDG_DATA_HOME", ".local/share").appendingPathComponent(appID, isDirectory: true)
    }
    /// Purgeable caches.
    public var caches: URL {
        base("XDG_CACHE_HOME", ".cache").appendingPathComponent(appID, isDirectory: true)
    }
    /// Preferences (UserDefaults' domain files live under `$XDG_CONFIG_HOME`, XDG-2).
    public var preferences: URL {
        base("XDG_CONFIG_HOME", ".config").appendingPathComponent(appID, isDirectory: true)
    }
    /// Files that need not survive a restart.
    public var temporary: URL {
        if let runtime = absolute("XDG_RUNTIME_DIR") {
            return runtime.appendingPathComponent(appID, isDirectory: true)
        }
        let tmp = absolute("TMPDIR") ?? URL(fileURLWithPath: "/tmp", isDirectory: true)
        return tmp.appendingPathComponent("\(appID)-\(getuid())", isDirectory: true)
    }
    /// Undo, autosave and version state.
    public var state: URL {
        base("XDG_STATE_HOME", ".local/state").appendingPathComponent(appID, isDirectory: true)
    }

    /// The folder for `directory`, created (0700, with its parents) when `create` is true.
    public func url(for directory: Directory, create: Bool = true) throws -> URL {
        let url: URL
        switch directory {
        case .documents: url = documents
        case .applicationSupport: url = applicationSupport
        case .caches: url = caches
        case .preferences: url = preferences
        case .temporary: url = temporary
        case .state: url = state
        }
        if create {
            try FileManager.default.createDirectory(
                at: url, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        }
        return url
    }
}
