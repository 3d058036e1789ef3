import Foundation

/// A store's identifier of a document. Stable for the store's life.
public struct DocumentID: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
    public var description: String { "document \(rawValue)" }
}

/// A store's identifier of a wrapper (node). Unique in the whole store and never reused, so it
/// can serve as a stable inode number.
public struct StoreNodeID: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
    public var description: String { "node \(rawValue)" }
}

/// A store's identifier of a saved version. Increases with every save in the store.
public struct VersionID: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
    public var description: String { "version \(rawValue)" }
}

/// A point in time in nanoseconds since 1970, exact (no floating-point rounding).
public struct Timestamp: RawRepresentable, Hashable, Comparable, Sendable {
    public let rawValue: Int64
    public init(rawValue: Int64) { self.rawValue = rawValue }
    public init(seconds: Int64, nanoseconds: Int64) { rawValue = seconds * 1_000_000_000 + nanoseconds }
    public init(_ date: Date) {
        let since2001 = date.timeIntervalSinceReferenceDate
        let whole = since2001.rounded(.down)
        rawValue = (Int64(whole) + 978_307_200) * 1_000_000_000 + Int64(((since2001 - whole) * 1e9).rounded())
    }
    public static var now: Timestamp { Timestamp(Date()) }
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
    public var seconds: Int64 {
        rawValue >= 0 ? rawValue / 1_000_000_000 : (rawValue - 999_999_999) / 1_000_000_000
    }
    public var nanoseconds: Int64 { rawValue - seconds * 1_000_000_000 }
    public var date: Date {
        Date(
            timeIntervalSinceReferenceDate: TimeInterval(seconds - 978_307_200) + TimeInterval(nanoseconds)
                / 1e9)
    }
}

/// Whether a document is a package (a directory of wrappers) or a flat file.
public enum DocumentKind: Int, Sendable, Codable {
    case flat = 0
    case package = 1
}

/// A document as listed by a store. Listing reads no contents.
public struct DocumentInfo: Sendable, Equatable {
    public var id: DocumentID
    /// The document's file name, e.g. `Things I Own.mystuff`.
    public var name: String
    /// The type identifier, e.g. `com.example.mystuff`; derived from the extension when not given.
    public var type: String
    public var kind: DocumentKind
    /// The root wrapper: the package directory, or the flat file.
    public var root: StoreNodeID
    /// The version the document is at.
    public var currentVersion: VersionID
    public var created: Timestamp
    public var modified: Timestamp
    /// When the document was deleted; nil while it is live.
    public var deleted: Timestamp?

    public init(
        id: DocumentID, name: String, type: String, kind: DocumentKind, root: StoreNodeID,
        currentVersion: VersionID, created: Timestamp, modified: Timestamp, deleted: Timestamp? = nil
    ) {
        self.id = id
        self.name = name
        self.type = type
        self.kind = kind
        self.root = root
        self.currentVersion = currentVersion
        self.created = created
        self.modified = modified
        self.deleted = deleted
    }

    /// A type identifier from the name's extension, for documents created without one.
    public static func typeIdentifier(forName name: String) -> String {
        let ext = (name as NSString).pathExtension.lowercased()
        switch ext {
        case "": return "public.data"
        case "txt", "text": return "public.plain-text"
        case "md", "markdown": return "net.daringfireball.markdown"
        case "rtf": return "public.rtf"
        case "rtfd": return "com.apple.rtfd"
        case "png": return "public.png"
        case "jpg", "jpeg": return "public.jpeg"
        case "json": return "public.json"
        case "plist": return "com.apple.property-list"
        default: return "dyn.docfs.\(ext)"
        }
    }
}

/// One wrapper's metadata at some version. Reading it reads no contents.
public struct NodeRecord: Sendable, Equatable {
    public var id: StoreNodeID
    public var document: DocumentID
    /// The parent directory; nil for the document's root.
    public var parent: StoreNodeID?
    /// The key in the parent (the file name); the document name for the root.
    public var name: String
    /// The wrapper's preferred name when it differs from the key (FW-8).
    public var preferredName: String?
    public var kind: FileWrapper.Kind
    /// POSIX permission bits.
    public var permissions: Int
    public var uid: UInt32
    public var gid: UInt32
    public var modified: Timestamp
    public var changed: Timestamp
    public var accessed: Timestamp
    public var created: Timestamp
    /// Content length of a regular file; 0 for others.
    public var size: Int64
    /// The destination of a symbolic link.
    public var linkTarget: String?
    /// The device number (`st_rdev`) of a character or block device; 0 for others.
    public var device: UInt64
    /// `user.` extended attributes.
    public var extendedAttributes: [String: Data]
    /// The wrapper whose file this record is another name of (a hard link), in the same
    /// document; nil for a wrapper's own record. Such a record keeps only its place (parent and
    /// name): the store reads everything else, contents included, from the wrapper it names.
    public var linkOf: StoreNodeID?
    /// The version that last changed this record (ignored when saving).
    public var version: VersionID

    public init(
        id: StoreNodeID, document: DocumentID, parent: StoreNodeID?, name: String,
        preferredName: String? = nil,
        kind: FileWrapper.Kind, permissions: Int, uid: UInt32 = UInt32(getuid()),
        gid: UInt32 = UInt32(getgid()),
        modified: Timestamp = .now, changed: Timestamp? = nil, accessed: Timestamp? = nil,
        created: Timestamp? = nil,
        size: Int64 = 0, linkTarget: String? = nil, device: UInt64 = 0,
        extendedAttributes: [String: Data] = [:], linkOf: StoreNodeID? = nil,
        version: VersionID = VersionID(rawValue: 0)
    ) {
        self.id = id
        self.document = document
        self.parent = parent
        self.name = name
        self.preferredName = preferredName
        self.kind = kind
        self.permissions = permissions
        self.uid = uid
        self.gid = gid
        self.modified = modified
        self.changed = changed ?? modified
        self.accessed = accessed ?? modified
        self.created = created ?? modified
        self.size = size
        self.linkTarget = linkTarget
        self.device = device
        self.extendedAttributes = extendedAttributes
        self.linkOf = linkOf
        self.version = version
    }

    /// Whether `other` differs from this record at most in its times and version.
    package func sameExceptTimes(_ other: NodeRecord) -> Bool {
        var other = other
        other.modified = modified
        other.changed = changed
        other.accessed = accessed
        other.created = created
        other.version = version
        return other == self
    }

    /// This record with each time the later of its own and `other`'s.
    package func withLaterTimes(of other: NodeRecord) -> NodeRecord {
        var record = self
        record.modified = max(modified, other.modified)
        record.changed = max(changed, other.changed)
        record.accessed = max(accessed, other.accessed)
        return record
    }

    /// This hard link's record as it reads: its own place and identity, everything else
    /// (kind, attributes, size) from `file`, the record it is another name of.
    public func resolvingLink(to file: NodeRecord) -> NodeRecord {
        var resolved = file
        resolved.id = id
        resolved.document = document
        resolved.parent = parent
        resolved.name = name
        resolved.preferredName = preferredName
        resolved.linkOf = linkOf
        resolved.version = version
        return resolved
    }
}

/// A new document's root wrapper: a folder for a package; for a flat document a regular file,
/// or a symbolic link or special file (what the mount root holds besides files and folders).
public struct DocumentRoot: Sendable, Equatable {
    public var kind: FileWrapper.Kind
    /// Permission bits; nil for the default (0o755 for a folder, 0o777 for a link, else 0o644).
    public var permissions: Int?
    /// A symbolic link's destination.
    public var linkTarget: String?
    /// A device's number.
    public var device: UInt64
    /// The owner; nil for the process's own user and group.
    public var uid: UInt32?
    public var gid: UInt32?
    /// The root wrapper's node id, reserved with ``DocumentStore/makeNodeIDs(count:)``; nil: a
    /// new one.
    public var node: StoreNodeID?

    public init(
        kind: FileWrapper.Kind, permissions: Int? = nil, linkTarget: String? = nil, device: UInt64 = 0,
        uid: UInt32? = nil, gid: UInt32? = nil, node: StoreNodeID? = nil
    ) {
        self.kind = kind
        self.permissions = permissions
        self.linkTarget = linkTarget
        self.device = device
        self.uid = uid
        self.gid = gid
        self.node = node
    }

    /// A package for a folder; flat for anything else.
    public var documentKind: DocumentKind { kind == .directory ? .package : .flat }
}
