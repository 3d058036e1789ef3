import CLinuxSupport
import Foundation
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

extension FileWrapper {
    /// What a write did, for callers that account for I/O (the incremental-save guarantee is
    /// tested against it).
    public struct WriteReport: Sendable, Equatable {
        /// Regular files whose bytes were written.
        public var regularFilesWritten = 0
        /// Bytes of file contents written.
        public var bytesWritten: Int64 = 0
        /// Regular files hard-linked from the original instead of written (W-6).
        public var regularFilesLinked = 0
        /// Directories created.
        public var directoriesCreated = 0
        /// Symbolic links created.
        public var symbolicLinksCreated = 0
        /// Special files (fifos, sockets, devices) created.
        public var specialFilesCreated = 0
        /// How an atomic write put the new item in place.
        public var replacement: Replacement = .none

        public init() {}
    }

    /// How an atomic write put the new item in place.
    public enum Replacement: Sendable, Equatable {
        /// Not an atomic write.
        case none
        /// Nothing was at the destination; the new item was renamed there.
        case renamed
        /// `renameat2(RENAME_EXCHANGE)` swapped the new item with the old one in one step.
        case exchanged
        /// The file system cannot exchange: the old item was moved aside, the new one renamed into
        /// place, then the old one removed. Not atomic for directories (see
        /// docs/library/differences-from-apple.md).
        case movedAside
    }

    /// Writes the wrapper's tree to `url`.
    ///
    /// - Without `.atomic`, a directory is created at `url` and fails if something exists there;
    ///   a regular file is overwritten in place (W-1).
    /// - With `.atomic`, the item is built in a hidden temporary folder beside `url` (so on the
    ///   same file system), every new file and folder is fsynced, and the item is swapped in with
    ///   `renameat2(RENAME_EXCHANGE)`; the old item is then removed and the parent folder fsynced.
    ///   Where the file system cannot exchange, the old item is moved aside first (W-2, LX-1).
    /// - With `originalContentsURL`, a regular-file descendant that still is what was read from
    ///   (or last written to) `originalContentsURL` is hard-linked from there instead of written;
    ///   if linking fails it is copied (W-6, LX-3). Only changed wrappers cost their bytes.
    /// - With `.withNameUpdating`, every descendant's `filename` becomes its key (W-7).
    ///
    /// Names on disk are the keys; `preferredFilename` is ignored (W-9). Written items take the
    /// wrapper's permissions less the umask, its modification date and its `user.` extended
    /// attributes (W-3); symbolic links take none. All writes inside the tree go through
    /// directory descriptors with `O_NOFOLLOW`, so nothing is written outside `url`.
    @discardableResult
    public func write(to url: URL, options: WritingOptions = [], originalContentsURL: URL? = nil) throws
        -> WriteReport
    {
        let name = url.lastPathComponent
        try FileName.validate(name)
        let plan = try WritePlan(self, key: name)
        var writer = TreeWriter(
            umask: POSIX.currentUmask(), durable: options.contains(.atomic) || options.contains(.durable),
            euid: geteuid(), egid: getegid())
        let original = originalContentsURL.map { OriginalItem(path: $0.path, fd: nil) }

        if options.contains(.atomic) {
            let scratch = try ScratchArea(replacing: url)
            try writer.write(plan, in: scratch.fd, at: scratch.itemPath, original: original, topLevel: false)
            writer.report.replacement = try scratch.commit()
        } else {
            let parentPath = url.deletingLastPathComponent().path
            let parentFD: Int32
            do { parentFD = try POSIX.open(parentPath, O_RDONLY | O_DIRECTORY) } catch {
                throw FileWrapperError.writeFailed(path: parentPath, error)
            }
            defer { POSIX.close(parentFD) }
            try writer.write(plan, in: parentFD, at: url.path, original: original, topLevel: true)
            if options.contains(.durable) {
                do { try POSIX.fsync(parentFD) } catch {
                    throw FileWrapperError.writeFailed(path: parentPath, error)
                }
            }
        }
        finishWrite(plan, finalPath: url.path, options: options, results: writer.results, isRoot: true)
        return writer.report
    }

    /// Tells the tree that the item written at `oldPath` was moved to `newPath` (Document's
    /// safe-save writes into a scratch folder and swaps it in): lazily read files whose source is
    /// under `oldPath` follow. Their inodes are unchanged by a rename, so identity checks still hold.
    func relocateDiskSources(from oldPath: String, to newPath: String) {
        state.withLock { s in
            guard case .regular(var r) = s.storage, let disk = r.source as? DiskContentsSource,
                disk.path == oldPath || disk.path.hasPrefix(oldPath + "/")
            else { return }
            r.source = DiskContentsSource(
                path: newPath + disk.path.dropFirst(oldPath.count), identity: disk.identity,
                mayMap: disk.mayMap)
            s.storage = .regular(r)
        }
        for child in loadedChildrenIfAny()?.values ?? [:].values {
            child.relocateDiskSources(from: oldPath, to: newPath)
        }
    }

    /// Bookkeeping after a successful write: attributes are clean, names updated (W-7), lazy
    /// sources follow the written files, and directories learn their new modification date.
    private func finishWrite(
        _ plan: WritePlan, finalPath: String, options: WritingOptions,
        results: [ObjectIdentifier: WrittenNode],
        isRoot: Bool
    ) {
        let result = results[ObjectIdentifier(plan)]
        let updateNames = options.contains(.withNameUpdating)
        plan.wrapper.state.withLock { s in
            s.attributesChanged = false
            if !isRoot && updateNames {
                s.filename = plan.key
                s.matchesDisk = true
            }
            if s.attributes.modificationDate == nil, let date = result?.modificationDate {
                s.attributes.modificationDate = date
            }
            if updateNames || isRoot, case .regular(var r) = s.storage, r.loaded == nil,
                r.source is DiskContentsSource, let identity = result?.identity
            {
                r.source = DiskContentsSource(
                    path: finalPath, identity: identity,
                    mayMap: (r.source as? DiskContentsSource)?.mayMap ?? false)
                r.generation &+= 1
                s.storage = .regular(r)
            }
        }
        for child in plan.children {
            child.wrapper.finishWrite(
                child, finalPath: finalPath + "/" + child.key, options: options, results: results,
                isRoot: false)
        }
    }
}

/// A snapshot of one node to write, taken under the node's lock so the I/O runs without locks.
final class WritePlan {
    let wrapper: FileWrapper
    let key: String
    let storage: FileWrapper.Storage
    let attributes: FileWrapper.Attributes
    let filename: String?
    let linkable: Bool
    let loadError: FileWrapperError?
    var children: [WritePlan] = []
    var destination: String?

    init(_ wrapper: FileWrapper, key: String) throws {
        try FileName.validate(key)
        self.wrapper = wrapper
        self.key = key
        let s = wrapper.state.withLock { $0 }
        storage = s.storage
        attributes = s.attributes
        filename = s.filename
        linkable = s.filename != nil && !s.attributesChanged && s.matchesDisk
        loadError = s.loadError
        switch storage {
        case .directory:
            let children: [String: FileWrapper]
            do { children = try wrapper.children() } catch {
                throw FileWrapperError.missingContents(path: key, reason: String(describing: error))
            }
            self.children = try children.sorted(by: { $0.key < $1.key }).map {
                try WritePlan($0.value, key: $0.key)
            }
        case .link:
            do { destination = try wrapper.symbolicLinkDestination() } catch {
                throw FileWrapperError.missingContents(path: key, reason: String(describing: error))
            }
        case .regular, .special:
            break
        }
    }
}

/// What was written for a node, for the bookkeeping after the write.
struct WrittenNode {
    var identity: FileIdentity?
    var modificationDate: Date?
}

/// The original item an incremental write links from.
struct OriginalItem {
    var path: String
    var fd: Int32?
}

/// Writes a plan through directory descriptors.
struct TreeWriter {
    let umask: mode_t
    /// fsync every new file and directory (atomic writes).
    let durable: Bool
    let euid: uid_t
    let egid: gid_t
    var report = FileWrapper.WriteReport()
    var results: [ObjectIdentifier: WrittenNode] = [:]

    init(umask: mode_t, durable: Bool, euid: uid_t, egid: gid_t) {
        self.umask = umask
        self.durable = durable
        self.euid = euid
        self.egid = egid
    }

    /// Writes `plan` as `plan.key` in `dirfd`. `original` is the item the node was read from, for
    /// hard-linking its regular-file descendants; at the top level the node itself is never linked
    /// (W-4), and a non-atomic top-level file is overwritten in place (W-1).
    mutating func write(
        _ plan: WritePlan, in dirfd: Int32, at path: String, original: OriginalItem?, topLevel: Bool
    )
        throws
    {
        switch plan.storage {
        case .regular(let regular):
            try writeRegular(plan, regular, in: dirfd, at: path, topLevel: topLevel)
        case .link:
            let destination = plan.destination ?? ""
            do { try POSIX.symlinkat(destination, dirfd, plan.key) } catch {
                throw FileWrapperError.writeFailed(path: path, error)
            }
            report.symbolicLinksCreated += 1
        case .directory:
            try writeDirectory(plan, in: dirfd, at: path, original: original)
        case .special(let kind, let device):
            do { try POSIX.makeSpecialFile(kind, device: device, in: dirfd, plan.key) } catch {
                throw FileWrapperError.writeFailed(path: path, error)
            }
            try applySpecialFileAttributes(plan.attributes, in: dirfd, plan.key, path: path)
            report.specialFilesCreated += 1
        }
    }

    private mutating func writeDirectory(
        _ plan: WritePlan, in dirfd: Int32, at path: String, original: OriginalItem?
    )
        throws
    {
        let fd: Int32
        do {
            try POSIX.mkdirat(dirfd, plan.key, 0o700)
            fd = try POSIX.openat(dirfd, plan.key, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
        } catch {
            throw FileWrapperError.writeFailed(path: path, error)
        }
        defer { POSIX.close(fd) }
        report.directoriesCreated += 1

        var originalFD: Int32?
        if let original {
            originalFD = try? POSIX.open(original.path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
        }
        defer { if let originalFD { POSIX.close(originalFD) } }

        for child in plan.children {
            let childPath = path + "/" + child.key
            var childOriginal: OriginalItem?
            if let originalFD, let original, let filename = child.filename {
                if case .regular = child.storage, child.linkable,
                    try link(child, from: originalFD, filename: filename, into: fd, at: childPath)
                {
                    continue
                }
                childOriginal = OriginalItem(path: original.path + "/" + filename, fd: nil)
            }
            try write(child, in: fd, at: childPath, original: childOriginal, topLevel: false)
        }
        try applyAttributes(plan.attributes, to: fd, path: path)
        let st = try? POSIX.fstat(fd)
        if durable {
            do { try POSIX.fsync(fd) } catch { throw FileWrapperError.writeFailed(path: path, error) }
        }
        results[ObjectIdentifier(plan)] = WrittenNode(
            identity: st.map(FileIdentity.init), modificationDate: st?.modificationDate)
    }

    /// Hard-links an unchanged file from the original folder (W-6); false if it is not eligible or
    /// the link fails, so that it is written instead.
    private mutating func link(
        _ plan: WritePlan, from originalFD: Int32, filename: String, into fd: Int32, at path: String
    )
        throws -> Bool
    {
        guard case .regular(let regular) = plan.storage,
            let st = try? POSIX.fstatat(originalFD, filename), (st.st_mode & S_IFMT) == S_IFREG,
            Int64(st.st_size) == regular.source.count
        else { return false }
        if let disk = regular.source as? DiskContentsSource, regular.loaded == nil {
            // We know exactly which file the contents are: require that very inode.
            guard disk.identity == FileIdentity(st) else { return false }
        } else {
            guard FileWrapper.datesMatch(plan.attributes.modificationDate, st.modificationDate) else {
                return false
            }
        }
        do {
            try POSIX.linkat(originalFD, filename, fd, plan.key)
        } catch .fileExists {
            throw FileWrapperError.writeFailed(path: path, .fileExists)
        } catch {
            return false  // EXDEV, EPERM (FUSE), EMLINK…: write the bytes instead (LX-3)
        }
        report.regularFilesLinked += 1
        results[ObjectIdentifier(plan)] = WrittenNode(
            identity: FileIdentity(st), modificationDate: st.modificationDate)
        return true
    }

    private mutating func writeRegular(
        _ plan: WritePlan, _ regular: FileWrapper.Regular, in dirfd: Int32, at path: String, topLevel: Bool
    ) throws {
        if topLevel, regular.loaded == nil, let disk = regular.source as? DiskContentsSource,
            let st = try? POSIX.fstatat(dirfd, plan.key, flags: 0), disk.identity == FileIdentity(st)
        {
            // Writing a lazily read file onto itself: O_TRUNC would destroy the bytes before
            // they are copied. They are already there; only the attributes need writing.
            try rewriteAttributesInPlace(plan, in: dirfd, at: path)
            return
        }
        let flags = topLevel ? (O_WRONLY | O_CREAT | O_TRUNC) : (O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW)
        let fd: Int32
        do { fd = try POSIX.openat(dirfd, plan.key, flags, 0o600) } catch {
            throw FileWrapperError.writeFailed(path: path, error)
        }
        defer { POSIX.close(fd) }
        let written: Int64
        do {
            if let loaded = regular.loaded {
                try POSIX.writeAll(fd, loaded)
                written = Int64(loaded.count)
            } else {
                written = try regular.source.write(to: FileDescriptor(rawValue: fd))
            }
        } catch let error as Errno {
            throw FileWrapperError.writeFailed(path: path, error)
        } catch let error as FileWrapperError {
            if case .writeFailed = error { throw error }
            // W-10: the contents could not be read (now or at an earlier lazy access).
            throw FileWrapperError.missingContents(path: path, reason: (plan.loadError ?? error).description)
        }
        report.regularFilesWritten += 1
        report.bytesWritten += written
        try applyAttributes(plan.attributes, to: fd, path: path)
        if durable {
            do { try POSIX.fsync(fd) } catch { throw FileWrapperError.writeFailed(path: path, error) }
        }
        let st = try? POSIX.fstat(fd)
        results[ObjectIdentifier(plan)] = WrittenNode(
            identity: st.map(FileIdentity.init), modificationDate: st?.modificationDate)
    }

    private mutating func rewriteAttributesInPlace(_ plan: WritePlan, in dirfd: Int32, at path: String) throws
    {
        let fd: Int32
        do { fd = try POSIX.openat(dirfd, plan.key, O_RDONLY) } catch {
            throw FileWrapperError.writeFailed(path: path, error)
        }
        defer { POSIX.close(fd) }
        try applyAttributes(plan.attributes, to: fd, path: path)
        let st = try? POSIX.fstat(fd)
        results[ObjectIdentifier(plan)] = WrittenNode(
            identity: st.map(FileIdentity.init), modificationDate: st?.modificationDate)
    }

    /// W-3 for a special file, by name: opening a fifo would block, and a device would open the
    /// device. Special files hold no `user.` attributes on Linux.
    private func applySpecialFileAttributes(
        _ attributes: FileWrapper.Attributes, in dirfd: Int32, _ name: String, path: String
    ) throws {
        if attributes.ownerID != nil || attributes.groupID != nil {
            let uid = attributes.ownerID.map { uid_t($0) } ?? uid_t.max
            let gid = attributes.groupID.map { gid_t($0) } ?? gid_t.max
            _ = fchownat(dirfd, name, uid, gid, AT_SYMLINK_NOFOLLOW)
        }
        if fchmodat(dirfd, name, mode_t(attributes.permissions) & ~umask & 0o7777, 0) != 0 {
            throw FileWrapperError.writeFailed(path: path, Errno(rawValue: errno))
        }
        if let date = attributes.modificationDate {
            var times = [timespec(tv_sec: 0, tv_nsec: docfs_utime_omit()), date.timespec]
            if utimensat(dirfd, name, &times, AT_SYMLINK_NOFOLLOW) != 0 {
                throw FileWrapperError.writeFailed(path: path, Errno(rawValue: errno))
            }
        }
    }

    /// W-3: owner where permitted, extended attributes, permissions less the umask, and the
    /// modification date last (anything written before would bump it).
    private func applyAttributes(_ attributes: FileWrapper.Attributes, to fd: Int32, path: String) throws {
        if attributes.ownerID != nil || attributes.groupID != nil {
            let uid = attributes.ownerID.map { uid_t($0) } ?? uid_t.max
            let gid = attributes.groupID.map { gid_t($0) } ?? gid_t.max
            let current = try? POSIX.fstat(fd)
            if current?.st_uid != uid || current?.st_gid != gid {
                // Only root (or a matching group) may chown; elsewhere the owner is the writer.
                _ = fchown(fd, uid, gid)
            }
        }
        for (name, value) in attributes.extendedAttributes.sorted(by: { $0.key < $1.key }) {
            do { try POSIX.setXattr(fd, name, value) } catch .notSupported {
                FileWrapper.logger.warning(
                    "\(path): the file system does not support extended attributes; \(name) not written")
            } catch {
                throw FileWrapperError.writeFailed(path: path, error)
            }
        }
        if fchmod(fd, mode_t(attributes.permissions) & ~umask & 0o7777) != 0 {
            throw FileWrapperError.writeFailed(path: path, Errno(rawValue: errno))
        }
        if let date = attributes.modificationDate {
            var times = [timespec(tv_sec: 0, tv_nsec: docfs_utime_omit()), date.timespec]
            if futimens(fd, &times) != 0 {
                throw FileWrapperError.writeFailed(path: path, Errno(rawValue: errno))
            }
        }
    }
}
