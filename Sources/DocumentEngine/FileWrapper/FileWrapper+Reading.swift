import Foundation
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

extension FileWrapper {
    /// Reads the item at `url`: a package folder, a flat file or a symbolic link (never followed,
    /// FW-7).
    ///
    /// By default the read is lazy: the item's name and attributes are read now; a
    /// directory's child list, a file's bytes and a link's destination are read on first access,
    /// level by level. With `.immediate` everything is read now. `filename` and
    /// `preferredFilename` become the last path component (FW-9, FW-10).
    public convenience init(url: URL, options: ReadingOptions = []) throws {
        let path = url.path
        let (storage, attributes) = try Self.readNode(
            path: path, options: options, mayMap: Self.mayMap(path, options))
        self.init(storage: storage, attributes: attributes)
        let name = url.lastPathComponent
        state.withLock {
            $0.filename = name
            $0.preferredFilename = name
            $0.matchesDisk = true
        }
        if options.contains(.immediate) { try loadRecursively() }
    }

    /// Reads the item at `url` again, in place: a child whose key equals a name on disk is
    /// re-read in place and keeps its identity; other children are removed and new entries
    /// added. A file wrapper whose contents are loaded and whose kind and modification date
    /// (within 1 s) match the disk keeps its contents and only refreshes its attributes. The kind
    /// may change (FW-1).
    public func read(from url: URL, options: ReadingOptions = []) throws {
        let path = url.path
        let mayMap = Self.mayMap(path, options)
        let (fresh, attributes) = try Self.readNode(path: path, options: options, mayMap: mayMap)
        let reloadedChildren: [String: FileWrapper]?
        if case .directory = fresh, let current = loadedChildrenIfAny() {
            reloadedChildren = try rereadChildren(current, at: path, options: options, mayMap: mayMap)
        } else {
            reloadedChildren = nil
        }
        let dropped = state.withLock { s -> [FileWrapper] in
            var dropped: [FileWrapper] = []
            switch (s.storage, fresh) {
            case (.regular(var current), .regular(let disk)):
                let unchanged =
                    current.loaded != nil
                    && Self.datesMatch(s.attributes.modificationDate, attributes.modificationDate)
                if !unchanged {
                    current.source = disk.source
                    current.loaded = nil
                    current.generation &+= 1
                }
                s.storage = .regular(current)
            case (.directory(let current), .directory(var disk)):
                if let reloadedChildren {
                    let kept = Set(reloadedChildren.values.map(ObjectIdentifier.init))
                    dropped = (current.children ?? [:]).values.filter { !kept.contains(ObjectIdentifier($0)) }
                    disk.children = reloadedChildren
                }
                s.storage = .directory(disk)
            default:
                if case .directory(let current) = s.storage {
                    dropped = Array((current.children ?? [:]).values)
                }
                if case .regular(let current) = s.storage, case .regular(var disk) = fresh {
                    disk.generation = current.generation &+ 1
                    s.storage = .regular(disk)
                } else {
                    s.storage = fresh
                }
            }
            s.attributes = attributes
            s.attributesChanged = false
            s.matchesDisk = true
            s.loadError = nil
            s.filename = url.lastPathComponent
            return dropped
        }
        for child in dropped {
            child.state.withLock { _ = $0.parents.removeValue(forKey: ObjectIdentifier(self)) }
        }
        if options.contains(.immediate) { try loadRecursively() }
    }

    /// Whether the wrapper matches the item at `url`: same kind and a modification date within
    /// 1 s, recursively for children already in memory; never compares bytes. False when
    /// the wrapper has no modification date (for example after a child was added, FW-19).
    public func matchesContents(of url: URL) -> Bool {
        guard let st = try? POSIX.lstat(url.path), st.fileKind == kind else { return false }
        guard let date = modificationDate, Self.datesMatch(date, st.modificationDate) else { return false }
        if let children = loadedChildrenIfAny() {
            for (key, child) in children {
                let name = child.filename ?? key
                if !child.matchesContents(of: url.appendingPathComponent(name, isDirectory: false)) {
                    return false
                }
            }
        }
        return true
    }

    /// Whether the item at `path` differs from the wrapper: `!matchesContents(of:)` (R-8; Apple
    /// deprecated this name on macOS).
    public func needsToBeUpdated(fromPath path: String) -> Bool {
        !matchesContents(of: URL(fileURLWithPath: path))
    }

    /// Re-reads the wrapper from `path` if it needs updating; returns whether it was updated
    /// (R-8; Apple deprecated this name on macOS in favour of ``read(from:options:)``).
    @discardableResult
    public func update(fromPath path: String) -> Bool {
        guard needsToBeUpdated(fromPath: path) else { return false }
        return (try? read(from: URL(fileURLWithPath: path))) != nil
    }

    // MARK: Internals

    static func datesMatch(_ a: Date?, _ b: Date?) -> Bool {
        guard let a, let b else { return false }
        return abs(a.timeIntervalSince(b)) < 1
    }

    static func mayMap(_ path: String, _ options: ReadingOptions) -> Bool {
        !options.contains(.withoutMapping) && POSIX.mappingAllowed(path: path)
    }

    func loadedChildrenIfAny() -> [String: FileWrapper]? {
        state.withLock {
            guard case .directory(let d) = $0.storage else { return nil }
            return d.children
        }
    }

    /// Reads one node's kind and attributes; its contents stay on disk.
    static func readNode(path: String, options: ReadingOptions, mayMap: Bool) throws -> (Storage, Attributes)
    {
        let st: stat
        do { st = try POSIX.lstat(path) } catch { throw FileWrapperError.readFailed(path: path, error) }
        return try node(path: path, st: st, options: options, mayMap: mayMap)
    }

    static func node(path: String, st: stat, options: ReadingOptions, mayMap: Bool) throws -> (
        Storage, Attributes
    ) {
        guard let kind = st.fileKind else { throw FileWrapperError.unsupportedFileType(path: path) }
        var attributes = Attributes(
            permissions: Int(st.st_mode & 0o7777),
            modificationDate: st.modificationDate,
            creationDate: nil,
            ownerID: Int(st.st_uid),
            groupID: Int(st.st_gid))
        // Links have no user. attributes, and reading a special file's could block or fail.
        if kind == .regularFile || kind == .directory {
            attributes.extendedAttributes = try readUserXattrs(path: path)
        }
        let origin = DiskOrigin(path: path, options: options, mayMap: mayMap)
        switch kind {
        case .regularFile:
            let source = DiskContentsSource(path: path, identity: FileIdentity(st), mayMap: mayMap)
            return (.regular(Regular(source: source, loaded: nil)), attributes)
        case .directory:
            return (.directory(Directory(children: nil, origin: origin)), attributes)
        case .symbolicLink:
            return (.link(Link(destination: nil, origin: origin)), attributes)
        case .characterDevice, .blockDevice:
            return (.special(kind, device: UInt64(st.st_rdev)), attributes)
        case .fifo, .socket:
            return (.special(kind, device: 0), attributes)
        }
    }

    static func readUserXattrs(path: String) throws -> [String: Data] {
        do {
            var result: [String: Data] = [:]
            for name in try POSIX.listXattrs(path: path) where name.hasPrefix("user.") {
                do { result[name] = try POSIX.getXattr(path: path, name) } catch Errno.noData { continue }
            }
            return result
        } catch {
            throw FileWrapperError.readFailed(path: path, error)
        }
    }

    /// The entries of the directory at `path` by validated UTF-8 name, sorted by bytes so that
    /// uniquing of equivalent names is deterministic.
    static func entries(ofDirectoryAt path: String) throws -> (fd: Int32, names: [String]) {
        let fd: Int32
        do { fd = try POSIX.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW) } catch {
            throw FileWrapperError.readFailed(path: path, error)
        }
        do {
            var names: [String] = []
            for raw in try POSIX.directoryEntries(fd).sorted(by: { $0.lexicographicallyPrecedes($1) }) {
                guard let name = String(validating: raw, as: UTF8.self) else {
                    throw FileWrapperError.nameNotUTF8(directory: path, escapedName: FileName.escaped(raw))
                }
                names.append(name)
            }
            return (fd, names)
        } catch {
            POSIX.close(fd)
            if let error = error as? Errno { throw FileWrapperError.readFailed(path: path, error) }
            throw error
        }
    }

    /// Builds the children of a lazily read directory.
    func readChildren(of origin: DiskOrigin) throws -> [String: FileWrapper] {
        let (fd, names) = try Self.entries(ofDirectoryAt: origin.path)
        defer { POSIX.close(fd) }
        var children: [String: FileWrapper] = [:]
        for name in names {
            guard let child = try makeChild(named: name, in: fd, directoryPath: origin.path, origin: origin)
            else {
                continue
            }
            children[Self.uniqueKey(for: name, in: children)] = child
        }
        if origin.options.contains(.immediate) {
            for child in children.values { try child.loadRecursively() }
        }
        return children
    }

    /// A child read from `name` in the directory `fd`, or nil if it vanished meanwhile.
    private func makeChild(named name: String, in fd: Int32, directoryPath: String, origin: DiskOrigin) throws
        -> FileWrapper?
    {
        let childPath = directoryPath + "/" + name
        let st: stat
        do { st = try POSIX.fstatat(fd, name) } catch Errno.noSuchFileOrDirectory { return nil } catch {
            throw FileWrapperError.readFailed(path: childPath, error)
        }
        let (storage, attributes) = try Self.node(
            path: childPath, st: st, options: origin.options, mayMap: origin.mayMap)
        let child = FileWrapper(storage: storage, attributes: attributes)
        child.state.withLock {
            $0.filename = name
            $0.preferredFilename = name
            $0.matchesDisk = true
            $0.parents[ObjectIdentifier(self)] = WeakParent(wrapper: self)
        }
        return child
    }

    /// children whose key equals a name on disk are re-read in place; the rest is rebuilt.
    private func rereadChildren(
        _ current: [String: FileWrapper], at path: String, options: ReadingOptions, mayMap: Bool
    ) throws -> [String: FileWrapper] {
        let (fd, names) = try Self.entries(ofDirectoryAt: path)
        defer { POSIX.close(fd) }
        let origin = DiskOrigin(path: path, options: options, mayMap: mayMap)
        var children: [String: FileWrapper] = [:]
        for name in names {
            if let existing = current[name], children[name] == nil {
                do {
                    try existing.read(from: URL(fileURLWithPath: path + "/" + name), options: options)
                    children[name] = existing
                    continue
                } catch FileWrapperError.readFailed(_, .noSuchFileOrDirectory) {
                    continue
                }
            }
            guard let child = try makeChild(named: name, in: fd, directoryPath: path, origin: origin) else {
                continue
            }
            children[Self.uniqueKey(for: name, in: children)] = child
            if options.contains(.immediate) { try child.loadRecursively() }
        }
        return children
    }

    /// Loads every lazy part of the tree.
    func loadRecursively() throws {
        switch kind {
        case .regularFile: _ = try contents()
        case .symbolicLink: _ = try symbolicLinkDestination()
        case .directory:
            for child in try children().values { try child.loadRecursively() }
        case .fifo, .socket, .characterDevice, .blockDevice: break
        }
    }
}
