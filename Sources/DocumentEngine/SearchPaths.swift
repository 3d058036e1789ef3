import Foundation

/// The iOS sandbox folders of an app, mapped onto the XDG base directories (SB-1, XDG-1..3; the
/// ids are defined in docs/library/apple-behaviours.md).
///
/// | iOS | Linux |
/// |---|---|
/// | Documents | `$XDG_DATA_HOME/<app>/Documents` |
/// | Library/Application Support | `$XDG_DATA_HOME/<app>` |
/// | Library/Caches | `$XDG_CACHE_HOME/<app>` |
/// | Library/Preferences | `$XDG_CONFIG_HOME/<app>` |
/// | tmp | `$XDG_RUNTIME_DIR/<app>`, else `$TMPDIR/<app>-<uid>` |
/// | (undo, autosave, state) | `$XDG_STATE_HOME/<app>` |
/// | `<App>.app` (read-only) | `$<APP>_BUNDLE_DIR`, else the executable's folder |
///
/// XDG variables are honoured only when absolute, as the specification requires; otherwise the
/// defaults `~/.local/share`, `~/.cache`, `~/.config` and `~/.local/state` apply. Folders are
/// created on demand by ``url(for:create:)->URL``, with mode 0700.
public struct SearchPaths: Sendable, Equatable {
    /// The sandbox folders.
    public enum Directory: Sendable, CaseIterable {
        case documents, applicationSupport, caches, preferences, temporary, state, bundle
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
    /// The app's read-only resources (iOS's `<App>.app`): `$<APP>_BUNDLE_DIR` (the app id in upper
    /// case, non-alphanumerics as `_`) if absolute, else the folder of the running executable.
    public var bundle: URL {
        let variable =
            appID.uppercased().map { $0.isLetter || $0.isNumber ? String($0) : "_" }.joined() + "_BUNDLE_DIR"
        if let dir = absolute(variable) { return dir }
        return URL(fileURLWithPath: CommandLine.arguments.first ?? "/", isDirectory: false)
            .deletingLastPathComponent()
    }

    /// Undo, autosave and version state.
    public var state: URL {
        base("XDG_STATE_HOME", ".local/state").appendingPathComponent(appID, isDirectory: true)
    }

    /// The folder Foundation's `FileManager.SearchPathDirectory` names on iOS, for this app
    /// (`urls(for:in:)` / `url(for:in:appropriateFor:create:)` in the seeds); nil for folders an
    /// iOS app has no counterpart of.
    public func url(for directory: FileManager.SearchPathDirectory, create: Bool = true) throws -> URL? {
        switch directory {
        case .documentDirectory: return try url(for: .documents, create: create)
        case .applicationSupportDirectory: return try url(for: .applicationSupport, create: create)
        case .cachesDirectory: return try url(for: .caches, create: create)
        case .libraryDirectory:
            return try url(for: .applicationSupport, create: create).deletingLastPathComponent()
        case .itemReplacementDirectory: return try url(for: .temporary, create: create)
        case .autosavedInformationDirectory:
            return try url(for: .state, create: create).appendingPathComponent(
                "Autosave Information", isDirectory: true)
        default: return nil
        }
    }

    /// `NSSearchPathForDirectoriesInDomains` for this app: the paths, tilde-abbreviated unless
    /// `expandTilde` (SB-2). The folders are not created.
    public func searchPathForDirectories(
        _ directory: FileManager.SearchPathDirectory, expandTilde: Bool = true
    ) -> [String] {
        guard let url = try? url(for: directory, create: false) else { return [] }
        let path = url.path
        let home = self.home.path
        if !expandTilde, path.hasPrefix(home + "/") { return ["~" + path.dropFirst(home.count)] }
        return [path]
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
        case .bundle: return bundle  // read-only: never created
        }
        if create {
            try FileManager.default.createDirectory(
                at: url, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        }
        return url
    }
}
