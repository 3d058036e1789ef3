import Foundation

/// A version of a document other than the current one — Apple's `NSFileVersion` (FV-1..FV-5, in
/// `docs/library/apple-behaviours.md`).
///
/// Linux has no version store (FV-L1). Versions of a document on disk are kept under
/// `$XDG_STATE_HOME/docfs/Versions/<hash of the document's path>/`; versions of a store document
/// are the store's own (every save is one; a conflict version is a save kept beside the current
/// one).
public final class DocumentVersion: Sendable, CustomStringConvertible {
    enum Source: Sendable {
        case disk(directory: URL, item: URL)
        case store(any DocumentStore, DocumentID, VersionID)
    }

    let source: Source
    /// When the version was saved.
    public let modificationDate: Date
    /// Whether it is a conflict version (FV-1).
    public let isConflict: Bool
    /// The document's name in that version.
    public let localizedName: String

    init(source: Source, modificationDate: Date, isConflict: Bool, localizedName: String) {
        self.source = source
        self.modificationDate = modificationDate
        self.isConflict = isConflict
        self.localizedName = localizedName
    }

    public var description: String {
        "\(isConflict ? "conflict " : "")version of \(localizedName) from \(modificationDate)"
    }

    /// Where the version's item can be read, for a version kept on disk.
    public var url: URL? {
        if case .disk(_, let item) = source { return item }
        return nil
    }

    /// Whether the conflict has been resolved. Always true for a version that is not a conflict
    /// (FV-2). Use ``resolve()`` to set it; it cannot be unset.
    public var isResolved: Bool {
        guard isConflict else { return true }
        switch source {
        case .disk(let directory, _): return (try? KeptVersionInfo.read(directory))?.isResolved ?? true
        case .store(let store, let document, let version):
            return (try? store.versions(of: document).first { $0.id == version })??.isResolved ?? true
        }
    }

    /// Marks the conflict resolved (FV-2: `isResolved = true`).
    public func resolve() throws {
        guard isConflict else { return }
        switch source {
        case .disk(let directory, _):
            var info = try KeptVersionInfo.read(directory)
            info.isResolved = true
            try info.write(directory)
        case .store(let store, _, let version):
            try store.resolveConflict(version)
        }
    }

    /// The version's contents as a wrapper tree (read lazily).
    public func fileWrapper() throws -> FileWrapper {
        switch source {
        case .disk(_, let item): return try FileWrapper(url: item)
        case .store(let store, let document, let version):
            return try store.fileWrapper(for: document, at: version)
        }
    }

    /// Makes this version's contents the document's current ones (FV-4), atomically; returns the
    /// document's URL. For a store document it is a restore, itself a new save.
    @discardableResult
    public func replaceItem(at url: URL) throws -> URL {
        switch source {
        case .disk:
            try fileWrapper().write(to: url, options: .atomic)
        case .store(let store, let document, let version):
            _ = try store.restore(version, of: document, origin: "conflict resolution")
        }
        return url
    }

    /// Deletes this version (FV-3). Store versions go when the retention policy drops them; a
    /// resolved conflict version is dropped by the next garbage collection.
    public func remove() throws {
        switch source {
        case .disk(let directory, _): try FileManager.default.removeItem(at: directory)
        case .store: try resolve()
        }
    }

    // MARK: Finding versions

    /// The unresolved conflict versions of a document (FV-1).
    public static func unresolvedConflictVersions(of location: DocumentLocation) -> [DocumentVersion] {
        otherVersions(of: location).filter { $0.isConflict && !$0.isResolved }
    }

    /// Every kept version of a document except the current one, oldest first (FV-1).
    public static func otherVersions(of location: DocumentLocation) -> [DocumentVersion] {
        switch location {
        case .file(let url): return DocumentVersionStore(for: url).versions()
        case .store(let store, let name):
            guard let info = try? store.document(named: name), let versions = try? store.versions(of: info.id)
            else {
                return []
            }
            return versions.filter { $0.id != info.currentVersion }.map {
                DocumentVersion(
                    source: .store(store, info.id, $0.id), modificationDate: $0.created.date,
                    isConflict: $0.isConflict,
                    localizedName: info.name)
            }
        }
    }

    /// NSFileVersion's `unresolvedConflictVersionsOfItem(at:)` for a document on disk.
    public static func unresolvedConflictVersionsOfItem(at url: URL) -> [DocumentVersion] {
        unresolvedConflictVersions(of: .file(url))
    }

    /// NSFileVersion's `otherVersionsOfItem(at:)` for a document on disk.
    public static func otherVersionsOfItem(at url: URL) -> [DocumentVersion] { otherVersions(of: .file(url)) }

    /// Deletes every kept version of a document on disk (FV-3; the current file stays).
    public static func removeOtherVersionsOfItem(at url: URL) throws {
        for version in otherVersionsOfItem(at: url) { try version.remove() }
    }
}

/// What is kept about a version on disk, beside its item.
struct KeptVersionInfo: Codable {
    var created: Date
    var isConflict: Bool
    var isResolved: Bool
    var name: String

    static func read(_ directory: URL) throws -> KeptVersionInfo {
        try PropertyListDecoder().decode(
            KeptVersionInfo.self, from: Data(contentsOf: directory.appendingPathComponent("version.plist")))
    }

    func write(_ directory: URL) throws {
        let encoder = PropertyListEncoder()
        encoder.outputFormat = .xml
        try encoder.encode(self).write(
            to: directory.appendingPathComponent("version.plist"), options: .atomic)
    }
}

/// Versions of one document on disk, kept in the user's state folder.
struct DocumentVersionStore {
    let directory: URL

    init(for document: URL) {
        let key = SHA256.hash(Data(document.standardizedFileURL.path.utf8)).prefix(16)
            .map { String(format: "%02x", $0) }.joined()
        directory = SearchPaths(appID: "docfs").state.appendingPathComponent("Versions", isDirectory: true)
            .appendingPathComponent(key, isDirectory: true)
    }

    /// Keeps `contents` (`Data` or a ``FileWrapper``) as a version; returns it.
    func keep(_ contents: Any, named name: String, asConflict: Bool) throws -> DocumentVersion {
        let created = Date()
        let versionDirectory = directory.appendingPathComponent(
            "\(Int64(created.timeIntervalSince1970 * 1000))-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(
            at: versionDirectory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let item = versionDirectory.appendingPathComponent(name)
        let wrapper =
            (contents as? FileWrapper) ?? FileWrapper(regularFileWithContents: contents as? Data ?? Data())
        try wrapper.write(to: item, options: [.durable])
        try KeptVersionInfo(created: created, isConflict: asConflict, isResolved: false, name: name).write(
            versionDirectory)
        return DocumentVersion(
            source: .disk(directory: versionDirectory, item: item), modificationDate: created,
            isConflict: asConflict,
            localizedName: name)
    }

    func versions() -> [DocumentVersion] {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: directory.path) else {
            return []
        }
        return entries.sorted().compactMap { entry in
            let versionDirectory = directory.appendingPathComponent(entry, isDirectory: true)
            guard let info = try? KeptVersionInfo.read(versionDirectory) else { return nil }
            return DocumentVersion(
                source: .disk(
                    directory: versionDirectory, item: versionDirectory.appendingPathComponent(info.name)),
                modificationDate: info.created, isConflict: info.isConflict, localizedName: info.name)
        }
    }
}
