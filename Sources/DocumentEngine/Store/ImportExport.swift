import CLinuxSupport
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// How far a long import or export has got.
public struct ProgressReport: Sendable, Equatable {
    /// Content bytes copied so far.
    public var completedByteCount: Int64
    /// Content bytes to copy in all.
    public var totalByteCount: Int64
    /// Items (files, folders and links) done so far.
    public var fileCompletedCount: Int
    /// Items in all.
    public var fileTotalCount: Int
    /// The item being copied, relative to the top of the document.
    public var currentName: String

    public init(
        completedByteCount: Int64 = 0, totalByteCount: Int64 = 0, fileCompletedCount: Int = 0,
        fileTotalCount: Int = 0, currentName: String = ""
    ) {
        self.completedByteCount = completedByteCount
        self.totalByteCount = totalByteCount
        self.fileCompletedCount = fileCompletedCount
        self.fileTotalCount = fileTotalCount
        self.currentName = currentName
    }

    /// The fraction done, by bytes, or by items when there are no bytes; 0...1.
    public var fractionCompleted: Double {
        if totalByteCount > 0 { return min(1, max(0, Double(completedByteCount) / Double(totalByteCount))) }
        if fileTotalCount > 0 { return min(1, max(0, Double(fileCompletedCount) / Double(fileTotalCount))) }
        return 1
    }
}

extension DocumentStore {
    /// Imports the item at `url` as a new document named `name` (its last path component when
    /// nil): a folder becomes a package document, a regular file a flat document.
    ///
    /// Keeps permissions, owners, modification and access times (to the nanosecond), `user.`
    /// extended attributes and symbolic links (never followed). Contents are copied chunk by
    /// chunk, never loaded whole, in one save. Other kinds of file (devices, sockets, fifos)
    /// are refused, as is a symbolic link at `url` itself.
    @discardableResult
    public func importItem(
        at url: URL, as name: String? = nil, progress: (@Sendable (ProgressReport) -> Void)? = nil
    ) throws -> DocumentInfo {
        let name = name ?? url.lastPathComponent
        if let reason = FileName.problem(with: name) {
            throw DocumentStoreError.invalidName(name, reason: reason)
        }
        let path = url.path
        let items = try ImportScan(path: path).items
        guard let top = items.first else { throw DocumentStoreError.io("cannot read \(path)") }
        if top.kind == .symbolicLink {
            throw DocumentStoreError.invalidChange("\(path) is a symbolic link; import the item it points to")
        }
        // A folder becomes a package; a file or a special file (fifo, socket, device) a flat document.
        let info = try createDocument(
            named: name,
            root: DocumentRoot(
                kind: top.kind, permissions: top.record.permissions, device: top.record.device),
            type: nil, origin: "import")
        do {
            let ids = try items.count > 1 ? makeNodeIDs(count: items.count - 1) : []
            let nodeIDs = [info.root] + ids
            let meter = ProgressMeter(
                total: ProgressReport(
                    totalByteCount: items.reduce(0) { $0 + ($1.kind == .regularFile ? $1.record.size : 0) },
                    fileTotalCount: items.count),
                handler: progress)
            var changes = DocumentChanges(document: info.id, base: info.currentVersion)
            changes.origin = "import"
            changes.conflictPolicy = .fail
            for (index, item) in items.enumerated() {
                var record = item.record
                record.id = nodeIDs[index]
                record.document = info.id
                record.parent = item.parent.map { nodeIDs[$0] }
                if index == 0 { record.name = name }
                record.linkOf = item.linkOf.map { nodeIDs[$0] }
                changes.nodes.append(record)
                if record.linkOf != nil {
                    meter.itemDone(item.relativePath)
                } else if item.kind == .regularFile, record.size > 0 {
                    let disk: DiskContentsSource
                    do { disk = try DiskContentsSource(path: item.path) } catch {
                        throw DocumentStoreError.io(String(describing: error))
                    }
                    guard disk.count == record.size else {
                        throw DocumentStoreError.io("\(item.path) changed while it was being imported")
                    }
                    changes.contents[record.id] = .replace(
                        MeteredContentsSource(base: disk, name: item.relativePath, meter: meter))
                } else {
                    if item.kind == .regularFile { changes.contents[record.id] = .chunks(size: 0, [:]) }
                    meter.itemDone(item.relativePath)
                }
            }
            _ = try save(changes)
            meter.finish()
            return try document(info.id)
        } catch {
            // The empty document would only be in the way of a retry.
            try? deleteDocument(info.id, origin: "import")
            throw error
        }
    }

    /// Writes `id` as it is at `version` (current when nil) to `url`: a package document as a
    /// folder, a flat one as a file, replacing what is at `url` atomically.
    ///
    /// Byte-identical contents, permissions (exactly, not less the umask), owners where
    /// permitted, modification and access times to the nanosecond, `user.` extended attributes,
    /// symbolic links and hard links. A name that could leave the target folder ("..", "/") is refused, as
    /// is a destination whose parent folder is a symbolic link.
    public func exportDocument(
        _ id: DocumentID, at version: VersionID? = nil, to url: URL,
        progress: (@Sendable (ProgressReport) -> Void)? = nil
    ) throws {
        let name = url.lastPathComponent
        if let reason = FileName.problem(with: name) {
            throw DocumentStoreError.invalidName(name, reason: reason)
        }
        let parentPath = url.deletingLastPathComponent().path
        var st = stat()
        guard lstat(parentPath, &st) == 0 else {
            throw DocumentStoreError.io("cannot export to \(url.path): \(String(cString: strerror(errno)))")
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else {
            let what = (st.st_mode & S_IFMT) == S_IFLNK ? "a symbolic link" : "not a folder"
            throw DocumentStoreError.invalidName(url.path, reason: "its parent \(parentPath) is \(what)")
        }
        let info = try document(id)
        let pinned = version ?? info.currentVersion
        let records = try nodes(of: id, at: pinned)
        let tree = try StoredTree(records: records, root: info.root, location: location)
        for record in records where record.id != info.root {
            if let reason = FileName.problem(with: record.name) {
                throw DocumentStoreError.invalidName(record.name, reason: reason)
            }
        }
        let meter = ProgressMeter(
            total: ProgressReport(
                totalByteCount: records.reduce(0) { $0 + ($1.kind == .regularFile ? $1.size : 0) },
                fileTotalCount: records.count),
            handler: progress)
        var paths: [StoreNodeID: String] = [:]
        func relativePath(_ record: NodeRecord) -> String {
            if let known = paths[record.id] { return known }
            var path = record.name
            if let parent = record.parent, parent != info.root, let parentRecord = tree.records[parent] {
                path = relativePath(parentRecord) + "/" + record.name
            }
            paths[record.id] = path
            return path
        }
        let wrapper = try tree.makeWrapper { record in
            if record.linkOf != nil {
                // Written as a link to its file below, not as a second copy of the bytes.
                meter.itemDone(relativePath(record))
                return (DataContentsSource(Data()), nil)
            }
            let source = StoreContentsSource(
                store: self, node: record.id, version: pinned, count: record.size)
            if record.kind == .regularFile && record.size > 0 {
                return (MeteredContentsSource(base: source, name: relativePath(record), meter: meter), nil)
            }
            meter.itemDone(relativePath(record))
            return (source, nil)
        }
        do {
            try wrapper.write(to: url, options: .atomic)
        } catch let error as FileWrapperError {
            if case .invalidFilename(let bad, let reason) = error {
                throw DocumentStoreError.invalidName(bad, reason: reason)
            }
            throw DocumentStoreError.io(error.description)
        }
        // Hard links: each extra name becomes a link to its file, as `cp -a` would make it.
        for record in records.sorted(by: { $0.id < $1.id }) {
            guard let target = record.linkOf, let file = tree.records[target] else { continue }
            let linkPath = url.path + "/" + relativePath(record)
            let filePath = url.path + "/" + relativePath(file)
            if unlink(linkPath) != 0 || Glibc.link(filePath, linkPath) != 0 {
                throw DocumentStoreError.io(
                    "cannot link \(linkPath) to \(filePath): \(String(cString: strerror(errno)))")
            }
        }
        // A Date cannot hold every nanosecond, and the writer applies the umask: set both exactly.
        try ExactAttributes.apply(tree, parentPath: parentPath, name: name)
        meter.finish()
    }
}

/// Progress shared by the sources of one import or export, which the store may read on threads
/// of its own: the handler is called on the thread that read the bytes.
final class ProgressMeter: Sendable {
    private let state: Mutex<ProgressReport>
    private let handler: (@Sendable (ProgressReport) -> Void)?

    init(total: ProgressReport, handler: (@Sendable (ProgressReport) -> Void)?) {
        state = Mutex(total)
        self.handler = handler
    }

    func add(bytes: Int, name: String, itemDone: Bool) {
        let report = state.withLock { r -> ProgressReport in
            r.completedByteCount += Int64(bytes)
            if itemDone { r.fileCompletedCount += 1 }
            r.currentName = name
            return r
        }
        handler?(report)
    }

    func itemDone(_ name: String) { add(bytes: 0, name: name, itemDone: true) }

    func finish() {
        let report = state.withLock { r -> ProgressReport in
            r.completedByteCount = r.totalByteCount
            r.fileCompletedCount = r.fileTotalCount
            r.currentName = ""
            return r
        }
        handler?(report)
    }
}

/// A source that reports the bytes read through it; an item is done when its last byte is read.
struct MeteredContentsSource: ContentsSource {
    let base: any ContentsSource
    let name: String
    let meter: ProgressMeter

    var count: Int64 { base.count }

    func read(offset: Int64, count: Int) throws -> Data {
        let data = try base.read(offset: offset, count: count)
        meter.add(
            bytes: data.count, name: name, itemDone: offset + Int64(data.count) >= base.count && !data.isEmpty
        )
        return data
    }
}

/// The items under a path, read without following links, parents before children.
struct ImportScan {
    struct Item {
        var path: String
        var relativePath: String
        var parent: Int?
        var kind: FileWrapper.Kind
        /// Metadata with placeholder ids.
        var record: NodeRecord
        /// The item this one is another name of (a hard link inside the imported tree).
        var linkOf: Int?
    }

    var items: [Item] = []
    /// The first item seen of each file with more than one name, by device and inode.
    private var firstNames: [FileIdentity: Int] = [:]

    private struct FileIdentity: Hashable {
        var device: UInt64
        var inode: UInt64
    }

    init(path: String) throws {
        try add(
            path: path, relativePath: "", name: (path as NSString).lastPathComponent, parent: nil, depth: 0)
    }

    private mutating func add(path: String, relativePath: String, name: String, parent: Int?, depth: Int)
        throws
    {
        guard depth < 4096 else { throw DocumentStoreError.invalidChange("\(path) nests too deep") }
        let st: stat
        do { st = try POSIX.lstat(path) } catch {
            throw DocumentStoreError.io("cannot read \(path): \(error)")
        }
        guard let kind = st.fileKind else {
            throw DocumentStoreError.invalidChange(
                "\(path) is of an unknown file type, so it cannot be imported")
        }
        var xattrs: [String: Data] = [:]
        var linkTarget: String?
        if kind == .symbolicLink {
            do { linkTarget = try POSIX.readlinkat(AT_FDCWD, path) } catch {
                throw DocumentStoreError.io("cannot read the link \(path): \(error)")
            }
        } else if !kind.isSpecialFile {
            do { xattrs = try FileWrapper.readUserXattrs(path: path) } catch {
                throw DocumentStoreError.io(String(describing: error))
            }
        }
        func time(_ t: timespec) -> Timestamp {
            Timestamp(seconds: Int64(t.tv_sec), nanoseconds: Int64(t.tv_nsec))
        }
        let record = NodeRecord(
            id: StoreNodeID(rawValue: 0), document: DocumentID(rawValue: 0), parent: nil, name: name,
            kind: kind,
            permissions: Int(st.st_mode & 0o7777), uid: UInt32(st.st_uid), gid: UInt32(st.st_gid),
            modified: time(st.st_mtim), changed: time(st.st_ctim), accessed: time(st.st_atim),
            created: time(st.st_ctim), size: kind == .regularFile ? Int64(st.st_size) : 0,
            linkTarget: linkTarget,
            device: kind == .characterDevice || kind == .blockDevice ? UInt64(st.st_rdev) : 0,
            extendedAttributes: xattrs)
        let index = items.count
        var linkOf: Int?
        if kind != .directory, parent != nil, st.st_nlink > 1 {
            // Names of one file inside the tree stay one file, as `cp -a` and `rsync -H` keep them.
            let identity = FileIdentity(device: UInt64(st.st_dev), inode: UInt64(st.st_ino))
            if let first = firstNames[identity], items[first].kind == kind {
                linkOf = first
            } else {
                firstNames[identity] = index
            }
        }
        items.append(
            Item(
                path: path, relativePath: relativePath, parent: parent, kind: kind, record: record,
                linkOf: linkOf))
        guard kind == .directory else { return }
        let (fd, names): (Int32, [String])
        do { (fd, names) = try FileWrapper.entries(ofDirectoryAt: path) } catch {
            throw DocumentStoreError.io(String(describing: error))
        }
        POSIX.close(fd)
        for child in names {
            try add(
                path: path + "/" + child,
                relativePath: relativePath.isEmpty ? child : relativePath + "/" + child,
                name: child, parent: index, depth: depth + 1)
        }
    }
}

/// Sets exported items' permissions and times exactly, through directory descriptors and
/// without following links.
enum ExactAttributes {
    static func apply(_ tree: StoredTree, parentPath: String, name: String) throws {
        let parentFD: Int32
        do { parentFD = try POSIX.open(parentPath, O_RDONLY | O_DIRECTORY | O_NOFOLLOW) } catch {
            throw DocumentStoreError.io("cannot open \(parentPath): \(error)")
        }
        defer { POSIX.close(parentFD) }
        guard let root = tree.records[tree.root] else { return }
        try apply(root, tree, in: parentFD, name: name, path: parentPath + "/" + name)
    }

    private static func apply(
        _ record: NodeRecord, _ tree: StoredTree, in dirfd: Int32, name: String, path: String
    )
        throws
    {
        if record.kind == .directory {
            let fd: Int32
            do { fd = try POSIX.openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW) } catch {
                throw DocumentStoreError.io("cannot open \(path): \(error)")
            }
            defer { POSIX.close(fd) }
            for (childName, id) in tree.children[record.id] ?? [:] {
                guard let child = tree.records[id] else { continue }
                try apply(child, tree, in: fd, name: childName, path: path + "/" + childName)
            }
        }
        let st: stat
        do { st = try POSIX.fstatat(dirfd, name) } catch {
            throw DocumentStoreError.io("cannot read \(path): \(error)")
        }
        guard st.fileKind == record.kind else {
            throw DocumentStoreError.io("\(path) was replaced while it was being exported")
        }
        if record.kind != .symbolicLink, Int(st.st_mode & 0o7777) != record.permissions & 0o7777 {
            if fchmodat(dirfd, name, mode_t(record.permissions & 0o7777), AT_SYMLINK_NOFOLLOW) != 0 {
                throw DocumentStoreError.io(
                    "cannot set the permissions of \(path): \(String(cString: strerror(errno)))")
            }
        }
        var times = [
            timespec(tv_sec: Int(record.accessed.seconds), tv_nsec: Int(record.accessed.nanoseconds)),
            timespec(tv_sec: Int(record.modified.seconds), tv_nsec: Int(record.modified.nanoseconds)),
        ]
        if utimensat(dirfd, name, &times, AT_SYMLINK_NOFOLLOW) != 0 {
            throw DocumentStoreError.io(
                "cannot set the times of \(path): \(String(cString: strerror(errno)))")
        }
    }
}
