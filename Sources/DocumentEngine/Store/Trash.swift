import Foundation

/// One item of a store's Trash: a deleted document, or a wrapper moved to the Trash through a
/// mount. The Trash is the store's own record, not copies: an item is the document's
/// last version, or the wrapper as the last version that had it, and it comes back from there.
public struct TrashItem: Sendable, Equatable, Codable {
    /// Its name in the Trash (`.Trash-UID/files/NAME`), unique among the items.
    public var name: String
    public var document: DocumentID
    /// A wrapper's node, and the version of its document that last had it; nil for a document.
    public var node: StoreNodeID?
    public var version: VersionID?
    /// Where it was, from the mount root: the document's name, then the wrapper's path.
    public var originalPath: String
    public var deleted: Timestamp

    public var isDocument: Bool { node == nil }

    public init(
        name: String, document: DocumentID, node: StoreNodeID? = nil, version: VersionID? = nil,
        originalPath: String, deleted: Timestamp
    ) {
        self.name = name
        self.document = document
        self.node = node
        self.version = version
        self.originalPath = originalPath
        self.deleted = deleted
    }
}

/// What a store records of its Trash beyond its deleted documents, in the setting
/// ``DocumentStore/trashSetting``: the wrappers moved there, the names deleted documents have in
/// it, and the deleted documents emptied from it (still deleted, until retention expires them).
public struct TrashRecord: Sendable, Equatable, Codable {
    public var wrappers: [TrashItem] = []
    /// Trash names given to deleted documents, by document id.
    public var names: [Int64: String] = [:]
    /// Deleted documents no longer shown in the Trash.
    public var emptied: Set<Int64> = []

    public init() {}

    /// The record kept in `text` (an empty record when there is none).
    public init(parsing text: String?, location: String) throws {
        guard let text, !text.isEmpty else { return }
        do {
            self = try JSONDecoder().decode(TrashRecord.self, from: Data(text.utf8))
        } catch {
            throw DocumentStoreError.corrupt(
                path: location, reason: "its Trash record is unreadable: \(error)")
        }
    }

    public var text: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return (try? encoder.encode(self)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    /// The Trash: deleted documents not emptied (under their recorded names, or their own
    /// names made unique), then the recorded wrappers; oldest first.
    public func items(deletedDocuments: [DocumentInfo]) -> [TrashItem] {
        var taken = Set(wrappers.map(\.name))
        for (id, name) in names where deletedDocuments.contains(where: { $0.id.rawValue == id }) {
            taken.insert(name)
        }
        var items: [TrashItem] = []
        for document in deletedDocuments.sorted(by: {
            ($0.deleted ?? $0.modified, $0.id) < ($1.deleted ?? $1.modified, $1.id)
        })
        where !emptied.contains(document.id.rawValue) {
            let name: String
            if let recorded = names[document.id.rawValue] {
                name = recorded
            } else {
                name = Self.unique(document.name, in: taken)
                taken.insert(name)
            }
            items.append(
                TrashItem(
                    name: name, document: document.id, originalPath: document.name,
                    deleted: document.deleted ?? document.modified))
        }
        return (items + wrappers).sorted { ($0.deleted, $0.name) < ($1.deleted, $1.name) }
    }

    /// `name`, or `name.2`, `name.3`… (as GIO names trash items), whichever is not in `taken`.
    public static func unique(_ name: String, in taken: Set<String>) -> String {
        if !taken.contains(name) { return name }
        var n = 2
        while taken.contains("\(name).\(n)") { n += 1 }
        return "\(name).\(n)"
    }
}

extension DocumentStore {
    /// The setting that holds the store's ``TrashRecord``.
    public static var trashSetting: String { trashSettingKey }

    /// The store's Trash: its deleted documents and the wrappers moved there, oldest first.
    /// Wrappers whose version retention has dropped are gone from it.
    public func trash() throws -> [TrashItem] {
        let record = try TrashRecord(parsing: setting(Self.trashSetting), location: location)
        let items = record.items(deletedDocuments: try deletedDocuments())
        let wrappers = items.filter { !$0.isDocument }
        guard !wrappers.isEmpty else { return items }
        let found = try nodes(
            wrappers.map { NodeLookup($0.node ?? StoreNodeID(rawValue: 0), at: $0.version) })
        var missing = Set<String>()
        for (item, result) in zip(wrappers, found) {
            if case .success(let record) = result, record != nil { continue }
            missing.insert(item.name)
        }
        return items.filter { $0.isDocument || !missing.contains($0.name) }
    }

    /// Versions the Trash still shows wrappers from, for retention to keep while the policy keeps
    /// deleted documents.
    public func trashedVersions(policy: RetentionPolicy, now: Timestamp = .now) throws -> Set<VersionID> {
        let record = try TrashRecord(parsing: setting(Self.trashSetting), location: location)
        return Set(
            record.wrappers.filter { !policy.isExpired(deletedAt: $0.deleted, now: now) }.compactMap(
                \.version))
    }
}

extension DocumentStoreTransaction {
    /// The store's Trash record, read in this transaction.
    public func trashRecord(location: String) throws -> TrashRecord {
        try TrashRecord(parsing: setting(trashSettingKey), location: location)
    }

    public func setTrashRecord(_ record: TrashRecord) throws {
        try setSetting(trashSettingKey, record.text)
    }
}

private let trashSettingKey = "trash"

// Ids and times are kept in the Trash record as their raw numbers.
extension DocumentID: Codable {}
extension StoreNodeID: Codable {}
extension VersionID: Codable {}
extension Timestamp: Codable {}
