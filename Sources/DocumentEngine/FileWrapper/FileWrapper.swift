import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A node of a file-system tree — a regular file, a directory or a symbolic link — with Apple's
/// `NSFileWrapper` semantics, for Linux.
///
/// Rule ids (FW-, R-, W-, SR-) are defined in `docs/library/apple-behaviours.md`. Deliberate
/// differences from Apple, all in `docs/library/differences-from-apple.md`:
/// - **Keys are case-sensitive** (FW-13, R-9). Apple folds case; Linux file systems do not, and a
///   package holding `Readme` and `README` must read and write back unchanged. Keys compare with
///   Swift `String` equality, which is case-sensitive but Unicode-normalization-insensitive, so two
///   canonically equivalent names in one folder are uniqued like Apple's case-folded duplicates.
/// - **Wrong-kind getters return nil** instead of raising (FW-2): `fileWrappers` on a file,
///   `regularFileContents` on a directory. Mutators on the wrong kind trap, as Apple's raise does.
/// - **No `X.tiff` icon skipping** when reading a directory.
/// - **Extended attributes**: only the `user.` namespace is read and written.
/// - **Contents are a ``ContentsSource``** readable by range, so large files need not be loaded.
///
/// All members are thread-safe.
public final class FileWrapper: Sendable {
    /// The kinds of wrapper: Apple's three (FW-1), and the special files a POSIX folder can hold
    /// besides, which have no contents: a named pipe, a socket, a character or block device.
    public enum Kind: Sendable, Equatable {
        case regularFile, directory, symbolicLink
        case fifo, socket, characterDevice, blockDevice

        /// Whether this is one of the special-file kinds (no contents, no children).
        public var isSpecialFile: Bool {
            switch self {
            case .fifo, .socket, .characterDevice, .blockDevice: return true
            case .regularFile, .directory, .symbolicLink: return false
            }
        }
    }

    /// Options for reading from disk.
    public struct ReadingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        /// Read the whole tree and its contents now.
        public static let immediate = ReadingOptions(rawValue: 1)
        /// Never memory-map file contents.
        public static let withoutMapping = ReadingOptions(rawValue: 2)
    }

    /// Options for writing to disk.
    public struct WritingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        /// Build the item beside its destination, make it durable, then swap it in (W-2).
        public static let atomic = WritingOptions(rawValue: 1)
        /// Afterwards, every descendant's `filename` is its key (W-7).
        public static let withNameUpdating = WritingOptions(rawValue: 2)
        /// fsync every file and folder written, without the atomic swap (Document's safe-save
        /// builds in its own scratch folder).
        static let durable = WritingOptions(rawValue: 1 << 16)
    }

    static let logger = Logger(label: "docfs.filewrapper")

    // MARK: State

    struct Attributes: Sendable {
        var permissions: Int
        var modificationDate: Date?
        var creationDate: Date?
        var ownerID: Int?
        var groupID: Int?
        var extendedAttributes: [String: Data] = [:]
    }

    /// Where a lazily read node is on disk.
    struct DiskOrigin: Sendable {
        var path: String
        var options: ReadingOptions
        var mayMap: Bool
    }

    struct Regular {
        var source: any ContentsSource
        /// The whole contents, once asked for through `regularFileContents`.
        var loaded: Data?
        /// Bumped whenever `source` is replaced, so a load that raced with a re-read is not cached.
        var generation: UInt64 = 0
    }

    struct Directory {
        /// nil until a lazily read directory is first listed.
        var children: [String: FileWrapper]?
        var origin: DiskOrigin?
    }

    struct Link {
        /// nil until a lazily read link is first asked for its destination.
        var destination: String?
        var origin: DiskOrigin?
    }

    enum Storage {
        case regular(Regular)
        case directory(Directory)
        case link(Link)
        /// A special file: its kind and, for a device, its device number.
        case special(Kind, device: UInt64)

        var kind: Kind {
            switch self {
            case .regular: return .regularFile
            case .directory: return .directory
            case .link: return .symbolicLink
            case .special(let kind, _): return kind
            }
        }
    }

    struct WeakParent {
        weak var wrapper: FileWrapper?
    }

    struct State {
        var storage: Storage
        var attributes: Attributes
        var preferredFilename: String?
        var filename: String?
        /// Attributes were set since the last read or write, so the node may not be hard-linked (W-6).
        var attributesChanged = false
        /// The node's data came from `filename` in the folder it was read from or written to.
        var matchesDisk = false
        var parents: [ObjectIdentifier: WeakParent] = [:]
        /// The error of a failed lazy read, reported by a later write (R-3, W-10).
        var loadError: FileWrapperError?
        /// The store wrapper this one was read from, for incremental saves back into the store.
        var storeOrigin: StoreOrigin?
        /// A root read from or saved to a store: that version's records, so that the next save
        /// based on it compares with them without reading them again.
        var storedTree: CachedStoredTree?
    }

    /// Where in a document store a wrapper was read from.
    struct StoreOrigin: Sendable, Equatable {
        var store: ObjectIdentifier
        var node: StoreNodeID
        var version: VersionID
    }

    /// All that can change about the node. It is the only stored property, so the class is
    /// `Sendable` by the compiler's check.
    let state: Mutex<State>

    init(storage: Storage, attributes: Attributes) {
        state = Mutex(State(storage: storage, attributes: attributes))
    }

    // MARK: Creating wrappers

    /// A regular-file wrapper holding `contents`, with permissions 0o666 and the current date as
    /// its modification date (FW-3). Its preferred name is nil until set.
    public convenience init(regularFileWithContents contents: Data) {
        self.init(regularFileWithContentsSource: DataContentsSource(contents))
        state.withLock {
            $0.storage = .regular(Regular(source: DataContentsSource(contents), loaded: contents))
        }
    }

    /// A regular-file wrapper whose contents come from `source`, read by range on demand.
    public init(regularFileWithContentsSource source: any ContentsSource) {
        state = Mutex(
            State(
                storage: .regular(Regular(source: source, loaded: nil)),
                attributes: Attributes(permissions: 0o666, modificationDate: Date())))
    }

    /// A directory wrapper (permissions 0o777, no modification date, FW-4). Each child without a
    /// preferred name takes its dictionary key as one; children are then added with the uniquing
    /// rule, so a child that already had another preferred name keeps it (FW-5).
    public init(directoryWithFileWrappers childrenByPreferredName: [String: FileWrapper]) {
        state = Mutex(
            State(
                storage: .directory(Directory(children: [:], origin: nil)),
                attributes: Attributes(permissions: 0o777)))
        for (name, child) in childrenByPreferredName.sorted(by: { $0.key < $1.key }) {
            if child.preferredFilename == nil { child.preferredFilename = name }
            addFileWrapper(child)
        }
    }

    /// A symbolic-link wrapper pointing at `url` (permissions 0o666, FW-4). It is written with the
    /// URL's relative path, so relative destinations stay relative (FW-7).
    public init(symbolicLinkWithDestinationURL url: URL) {
        state = Mutex(
            State(
                storage: .link(Link(destination: url.relativePath, origin: nil)),
                attributes: Attributes(permissions: 0o666)))
    }

    /// A symbolic-link wrapper whose destination is the path `destination`, stored as given.
    public init(symbolicLinkWithDestination destination: String) {
        state = Mutex(
            State(
                storage: .link(Link(destination: destination, origin: nil)),
                attributes: Attributes(permissions: 0o666)))
    }

    /// A special-file wrapper (permissions 0o666): a named pipe, a socket, or a device with
    /// `device` as its number (`st_rdev`). Nil for a kind that is not a special file. Writing a
    /// device to disk needs the privilege to create one (`CAP_MKNOD`).
    public init?(specialFileOfKind kind: Kind, device: UInt64 = 0) {
        guard kind.isSpecialFile else { return nil }
        let isDevice = kind == .characterDevice || kind == .blockDevice
        state = Mutex(
            State(
                storage: .special(kind, device: isDevice ? device : 0),
                attributes: Attributes(permissions: 0o666)))
    }

    // MARK: Kind

    /// The wrapper's kind. Reading from disk may change it (FW-1).
    public var kind: Kind { state.withLock { $0.storage.kind } }
    /// Whether this is a regular-file wrapper.
    public var isRegularFile: Bool { kind == .regularFile }
    /// Whether this is a directory wrapper.
    public var isDirectory: Bool { kind == .directory }
    /// Whether this is a symbolic-link wrapper.
    public var isSymbolicLink: Bool { kind == .symbolicLink }
    /// Whether this is a special-file wrapper (fifo, socket or device).
    public var isSpecialFile: Bool { kind.isSpecialFile }
    /// The device number of a device wrapper; nil for every other kind.
    public var deviceIdentifier: UInt64? {
        state.withLock {
            guard case .special(let kind, let device) = $0.storage,
                kind == .characterDevice || kind == .blockDevice
            else { return nil }
            return device
        }
    }

    // MARK: Names (FW-8..11)

    /// The name the wrapper would like to have in a parent. Not unique: a parent derives a unique
    /// key from it (FW-12). Setting it re-keys the wrapper in every parent. Setting nil or "" is a
    /// programming error and traps, as Apple raises (FW-11).
    public var preferredFilename: String? {
        get { state.withLock { $0.preferredFilename } }
        set {
            guard let newValue, !newValue.isEmpty else {
                preconditionFailure(
                    "FileWrapper.preferredFilename cannot be set to nil or an empty string (FW-11)")
            }
            let parents = state.withLock { s -> [FileWrapper] in
                s.preferredFilename = newValue
                return s.parents.values.compactMap(\.wrapper)
            }
            for parent in parents { parent.rekey(self) }
        }
    }

    /// The name the wrapper had on disk when last read or written (FW-9). Record-keeping only:
    /// ask the parent for ``keyForChildFileWrapper(_:)`` to know the name it will be written under.
    public var filename: String? {
        get { state.withLock { $0.filename } }
        set { state.withLock { $0.filename = newValue } }
    }

    // MARK: Attributes

    /// The wrapper's attributes: `.type`, `.posixPermissions` (Int), `.modificationDate`,
    /// `.creationDate`, `.ownerAccountID`/`.groupOwnerAccountID` (Int), `.size` (Int, regular
    /// files) and `FileAttributeKey.extendedAttributes` (`[String: Data]`, `user.` names).
    ///
    /// Setting them marks the node to have its attributes written, which disables hard-linking it
    /// on the next incremental write (FW-6, W-6). A dictionary without `.type` or
    /// `.posixPermissions` is a programming error and traps, as Apple raises (FW-6). The kind
    /// cannot be changed this way; other keys are ignored.
    public var fileAttributes: [FileAttributeKey: Any] {
        get {
            let (attributes, kind, size) = state.withLock { s -> (Attributes, Kind, Int64?) in
                if case .regular(let r) = s.storage { return (s.attributes, .regularFile, r.source.count) }
                return (s.attributes, s.storage.kind, nil)
            }
            var result: [FileAttributeKey: Any] = [
                .type: kind.fileAttributeType,
                .posixPermissions: attributes.permissions,
            ]
            if let date = attributes.modificationDate { result[.modificationDate] = date }
            if let date = attributes.creationDate { result[.creationDate] = date }
            if let owner = attributes.ownerID { result[.ownerAccountID] = owner }
            if let group = attributes.groupID { result[.groupOwnerAccountID] = group }
            if let size { result[.size] = Int(size) }
            if !attributes.extendedAttributes.isEmpty {
                result[.extendedAttributes] = attributes.extendedAttributes
            }
            return result
        }
        set {
            guard newValue[.type] != nil, let permissions = Self.integer(newValue[.posixPermissions]) else {
                preconditionFailure(
                    "FileWrapper.fileAttributes must contain .type and .posixPermissions (FW-6)")
            }
            var attributes = Attributes(permissions: permissions & 0o7777)
            attributes.modificationDate = newValue[.modificationDate] as? Date
            attributes.creationDate = newValue[.creationDate] as? Date
            attributes.ownerID = Self.integer(newValue[.ownerAccountID])
            attributes.groupID = Self.integer(newValue[.groupOwnerAccountID])
            if let xattrs = newValue[.extendedAttributes] as? [String: Data] {
                attributes.extendedAttributes = xattrs.filter { $0.key.hasPrefix("user.") }
            }
            state.withLock {
                $0.attributes = attributes
                $0.attributesChanged = true
            }
        }
    }

    /// The POSIX permission bits (mode & 0o7777).
    public var posixPermissions: Int { state.withLock { $0.attributes.permissions } }

    /// The modification date, if the wrapper has one.
    public var modificationDate: Date? { state.withLock { $0.attributes.modificationDate } }

    /// The `user.` extended attributes. Setting them counts as setting attributes (FW-6).
    public var extendedAttributes: [String: Data] {
        get { state.withLock { $0.attributes.extendedAttributes } }
        set {
            state.withLock {
                $0.attributes.extendedAttributes = newValue.filter { $0.key.hasPrefix("user.") }
                $0.attributesChanged = true
            }
        }
    }

    static func integer(_ value: Any?) -> Int? {
        switch value {
        case let v as Int: return v
        case let v as Int16: return Int(v)
        case let v as UInt16: return Int(v)
        case let v as Int32: return Int(v)
        case let v as UInt32: return Int(v)
        case let v as Int64: return Int(v)
        case let v as UInt64: return Int(exactly: v)
        case let v as UInt: return Int(exactly: v)
        case let v as NSNumber: return v.intValue
        default: return nil
        }
    }

    // MARK: Regular-file contents

    /// The whole contents of a regular-file wrapper, or nil for another kind or when a lazy read
    /// fails (R-3; the error is kept for the next write, and ``contents()`` throws it).
    public var regularFileContents: Data? {
        do { return try contents() } catch {
            return nil
        }
    }

    /// The whole contents of a regular-file wrapper; throws why they cannot be read.
    public func contents() throws -> Data {
        let (source, loaded, generation) = try regularState()
        if let loaded { return loaded }
        let data: Data
        do { data = try source.data() } catch { throw noteLoadFailure(error) }
        state.withLock {
            if case .regular(var r) = $0.storage, r.generation == generation, r.loaded == nil {
                r.loaded = data
                $0.storage = .regular(r)
            }
        }
        return data
    }

    /// Up to `count` bytes of a regular-file wrapper's contents from `offset`, without loading the
    /// rest. Shorter only at the end.
    public func readContents(offset: Int64, count: Int) throws -> Data {
        let (source, loaded, _) = try regularState()
        if let loaded { return try DataContentsSource(loaded).read(offset: offset, count: count) }
        do { return try source.read(offset: offset, count: count) } catch { throw noteLoadFailure(error) }
    }

    /// The source of a regular-file wrapper's contents, or nil for another kind.
    public var contentsSource: (any ContentsSource)? {
        state.withLock {
            guard case .regular(let r) = $0.storage else { return nil }
            if let loaded = r.loaded, !(r.source is DataContentsSource) { return DataContentsSource(loaded) }
            return r.source
        }
    }

    /// The size in bytes of a regular-file wrapper's contents, known without reading them.
    public var contentsLength: Int64? {
        state.withLock {
            guard case .regular(let r) = $0.storage else { return nil }
            return r.source.count
        }
    }

    private func regularState() throws -> (any ContentsSource, Data?, UInt64) {
        try state.withLock { s throws(FileWrapperError) -> (any ContentsSource, Data?, UInt64) in
            guard case .regular(let r) = s.storage else {
                throw FileWrapperError.notARegularFile(
                    path: s.filename ?? s.preferredFilename ?? "(unnamed wrapper)")
            }
            return (r.source, r.loaded, r.generation)
        }
    }

    /// Remembers a lazy-read failure and logs it once per process.
    func noteLoadFailure(_ error: any Error) -> FileWrapperError {
        // Keep another layer's message (a damaged store chunk, say) rather than a bare EIO.
        let failure =
            (error as? FileWrapperError)
            ?? .missingContents(path: filename ?? "(unnamed wrapper)", reason: String(describing: error))
        state.withLock { $0.loadError = failure }
        Self.logOnce(failure)
        return failure
    }

    private static let loggedLoadFailure = Atomic<Bool>(false)

    private static func logOnce(_ error: FileWrapperError) {
        if !loggedLoadFailure.exchange(true, ordering: .relaxed) {
            logger.warning("lazy file wrapper read failed: \(error.description)")
        }
    }

    // MARK: Symbolic links

    /// The destination of a symbolic-link wrapper, or nil for another kind or a failed lazy read.
    public var symbolicLinkDestinationURL: URL? {
        guard let destination = try? symbolicLinkDestination() else { return nil }
        return URL(fileURLWithPath: destination)
    }

    /// The destination path of a symbolic-link wrapper, exactly as stored on disk.
    public func symbolicLinkDestination() throws -> String {
        let (destination, origin) = try state.withLock {
            s throws(FileWrapperError) -> (String?, DiskOrigin?) in
            guard case .link(let l) = s.storage else {
                throw FileWrapperError.unsupportedFileType(path: s.filename ?? "(unnamed wrapper)")
            }
            return (l.destination, l.origin)
        }
        if let destination { return destination }
        guard let origin else {
            throw noteLoadFailure(FileWrapperError.missingContents(path: "(link)", reason: "no destination"))
        }
        let target: String
        do { target = try POSIX.readlinkat(AT_FDCWD, origin.path) } catch {
            throw noteLoadFailure(FileWrapperError.readFailed(path: origin.path, error))
        }
        state.withLock {
            if case .link(var l) = $0.storage, l.destination == nil {
                l.destination = target
                $0.storage = .link(l)
            }
        }
        return target
    }

    // MARK: Directory children (FW-12..22)

    /// The children of a directory wrapper by key: a snapshot, not a live view (FW-20). nil for
    /// another kind, or when a lazy read of the directory fails (the error is kept, R-3).
    public var fileWrappers: [String: FileWrapper]? {
        guard isDirectory else { return nil }
        return try? children()
    }

    /// The children of a directory wrapper by key; throws why a lazy read failed.
    public func children() throws -> [String: FileWrapper] {
        let (children, origin, name) = try state.withLock {
            s throws(FileWrapperError) -> ([String: FileWrapper]?, DiskOrigin?, String) in
            let name = s.filename ?? s.preferredFilename ?? "(unnamed wrapper)"
            guard case .directory(let d) = s.storage else {
                throw FileWrapperError.unsupportedFileType(path: name)
            }
            return (d.children, d.origin, name)
        }
        if let children { return children }
        guard let origin else {
            throw FileWrapperError.missingContents(path: name, reason: "directory has no source")
        }
        let loaded: [String: FileWrapper]
        do { loaded = try readChildren(of: origin) } catch { throw noteLoadFailure(error) }
        return state.withLock { s in
            guard case .directory(var d) = s.storage else { return loaded }
            if let existing = d.children { return existing }
            d.children = loaded
            s.storage = .directory(d)
            return loaded
        }
    }

    /// Adds `child` under a key derived from its preferred name and returns the key. Adding a
    /// wrapper that is already a child returns its key and changes nothing (FW-14). The child must
    /// have a preferred name (FW-15) and this must be a directory wrapper (FW-2); otherwise this
    /// traps, as Apple raises.
    @discardableResult
    public func addFileWrapper(_ child: FileWrapper) -> String {
        guard let name = child.preferredFilename, !name.isEmpty else {
            preconditionFailure("FileWrapper.addFileWrapper: the child has no preferred file name (FW-15)")
        }
        precondition(
            child !== self && !hasAncestor(child),
            "FileWrapper.addFileWrapper: a wrapper cannot contain itself")
        requireDirectory("addFileWrapper")
        let existing = (try? children()) ?? [:]
        let key = state.withLock { s -> String in
            guard case .directory(var d) = s.storage else { return name }
            var current = d.children ?? existing
            if let key = current.first(where: { $0.value === child })?.key { return key }
            let key = Self.uniqueKey(for: name, in: current)
            current[key] = child
            d.children = current
            s.storage = .directory(d)
            s.attributes.modificationDate = nil  // FW-19
            return key
        }
        child.state.withLock { $0.parents[ObjectIdentifier(self)] = WeakParent(wrapper: self) }
        return key
    }

    /// Creates a regular-file wrapper with `contents`, sets its preferred name, adds it and
    /// returns its key (FW-16).
    @discardableResult
    public func addRegularFile(withContents contents: Data, preferredFilename: String) -> String {
        let child = FileWrapper(regularFileWithContents: contents)
        child.preferredFilename = preferredFilename
        return addFileWrapper(child)
    }

    /// Removes `child` by identity, not by name; does nothing if it is not a child (FW-17).
    public func removeFileWrapper(_ child: FileWrapper) {
        requireDirectory("removeFileWrapper")
        _ = try? children()
        let removed = state.withLock { s -> Bool in
            guard case .directory(var d) = s.storage, var current = d.children,
                let key = current.first(where: { $0.value === child })?.key
            else { return false }
            current.removeValue(forKey: key)
            d.children = current
            s.storage = .directory(d)
            s.attributes.modificationDate = nil  // FW-19
            return true
        }
        if removed {
            child.state.withLock { _ = $0.parents.removeValue(forKey: ObjectIdentifier(self)) }
        }
    }

    /// The key of `child` in this directory, by identity, or nil if it is not a child (FW-18).
    public func keyForChildFileWrapper(_ child: FileWrapper) -> String? {
        guard let children = try? children() else { return nil }
        return children.first(where: { $0.value === child })?.key
    }

    /// Objective-C's name for ``keyForChildFileWrapper(_:)``.
    public func keyForFileWrapper(_ child: FileWrapper) -> String? { keyForChildFileWrapper(child) }

    /// Whether `wrapper` is this wrapper's parent, or a parent of a parent, in any tree.
    func hasAncestor(_ wrapper: FileWrapper) -> Bool {
        var seen: Set<ObjectIdentifier> = []
        var pending = state.withLock { $0.parents.values.compactMap(\.wrapper) }
        while let next = pending.popLast() {
            if next === wrapper { return true }
            guard seen.insert(ObjectIdentifier(next)).inserted else { continue }
            pending += next.state.withLock { $0.parents.values.compactMap(\.wrapper) }
        }
        return false
    }

    /// Removes and re-adds `child` so its key follows a new preferred name (FW-11).
    func rekey(_ child: FileWrapper) {
        guard let name = child.preferredFilename else { return }
        state.withLock { s in
            guard case .directory(var d) = s.storage, var current = d.children,
                let old = current.first(where: { $0.value === child })?.key
            else { return }
            current.removeValue(forKey: old)
            let key = Self.uniqueKey(for: name, in: current)
            current[key] = child
            d.children = current
            s.storage = .directory(d)
            s.attributes.modificationDate = nil
        }
    }

    private func requireDirectory(_ operation: String) {
        if !isDirectory {
            preconditionFailure("FileWrapper.\(operation) called on a wrapper that is not a directory (FW-2)")
        }
    }

    /// The infix of uniqued keys (FW-12).
    public static let uniquingInfix = "__#$!@%!#__"

    /// `name` if no key equals it, else `"<n>__#$!@%!#__name"` for the smallest free n ≥ 1 (FW-12).
    /// The prefix is always built on the preferred name, never on a previous key.
    static func uniqueKey(for name: String, in children: [String: FileWrapper]) -> String {
        if children[name] == nil { return name }
        var n = 1
        while children["\(n)\(uniquingInfix)\(name)"] != nil { n += 1 }
        return "\(n)\(uniquingInfix)\(name)"
    }

    /// The preferred name a uniqued key was made from: the key without its `n__#$!@%!#__` prefix
    /// (SR-3).
    public static func preferredFilename(fromKey key: String) -> String {
        guard let range = key.range(of: uniquingInfix) else { return key }
        let prefix = key[key.startIndex..<range.lowerBound]
        guard !prefix.isEmpty, prefix.allSatisfy(\.isASCII), prefix.allSatisfy(\.isNumber) else { return key }
        let rest = key[range.upperBound...]
        return rest.isEmpty ? key : String(rest)
    }
}

extension FileWrapper.Kind {
    var fileAttributeType: FileAttributeType {
        switch self {
        case .regularFile: return .typeRegular
        case .directory: return .typeDirectory
        case .symbolicLink: return .typeSymbolicLink
        case .socket: return .typeSocket
        // Foundation has no type for a named pipe; Apple's FileManager reports it as unknown.
        case .fifo: return .typeUnknown
        case .characterDevice: return .typeCharacterSpecial
        case .blockDevice: return .typeBlockSpecial
        }
    }
}

extension FileAttributeKey {
    /// Extended attributes as `[String: Data]` (Apple's `NSFileExtendedAttributes`).
    public static let extendedAttributes = FileAttributeKey("NSFileExtendedAttributes")
}
