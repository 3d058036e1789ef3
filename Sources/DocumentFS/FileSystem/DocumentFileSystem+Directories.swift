import DocumentEngine
import FUSE
import Foundation
import Logging
import Synchronization
import SystemPackage
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// Directories: opening, listing and syncing them, at the root and in packages.
extension DocumentFileSystem {
    public func opendir(
        _ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen
    ) {
        do throws(Errno) {
            if node == .root { try ensureListing() }
            let directory = try resolver.resolve(node, loadingChildren: true)
            if let directory { try reconciler.revalidate(directory) }
            if let directory, directory.role != nil { try desktop.refreshVirtual(directory, force: true) }
            let (handle, keep) = try state.withLock { state throws(Errno) in
                if let directory, directory.kind != .directory { throw .notDirectory }
                let ino = directory?.ino ?? mountRootInode
                // The kernel's cached listing is still right if no entry came or went since the
                // last open: every change of a directory's entries gives it a new generation.
                let generation = directory?.children.generation ?? state.rootEntries.generation
                let keep = state.listedGenerations[ino] == generation
                state.listedGenerations[ino] = generation
                let handle = state.nextHandle
                state.nextHandle += 1
                state.directories[handle] = OpenDirectory(ino: ino, entries: nil)
                return (handle, keep)
            }
            // The kernel may cache the listing; a change invalidates the directory's inode.
            reply.opened(
                FUSE.FileHandle(handle), options: keep ? [.cacheDirectory, .keepCache] : [.cacheDirectory])
        } catch { reply.error(error) }
    }

    /// A directory's entries with their attributes, `.` and `..` first, then in the order of
    /// their cookies (``ViewNode/cookie``).
    func listDirectory(_ state: inout State, _ directory: ViewNode?) throws(Errno) -> [DirectoryEntry] {
        var entries: [DirectoryEntry] = []
        let children: [ViewNode]
        if let directory {
            guard directory.kind == .directory else { throw .notDirectory }
            let own = attributes(directory)
            entries.append(DirectoryEntry(cookie: 1, name: ".", ino: directory.ino, attributes: own))
            let parent = directory.parent.map { attributes($0) } ?? rootAttributes(&state)
            entries.append(
                DirectoryEntry(
                    cookie: 2, name: "..", ino: directory.parent?.ino ?? mountRootInode, attributes: parent))
            children = Array(directory.children.values)
        } else {
            let own = rootAttributes(&state)
            entries.append(DirectoryEntry(cookie: 1, name: ".", ino: mountRootInode, attributes: own))
            entries.append(DirectoryEntry(cookie: 2, name: "..", ino: mountRootInode, attributes: own))
            children = Array(state.rootEntries.values)
        }
        for child in children.sorted(by: { $0.cookie < $1.cookie }) {
            entries.append(
                DirectoryEntry(
                    cookie: child.cookie, name: child.name, ino: (child.linkOf ?? child).ino,
                    attributes: attributes(child)))
        }
        return entries
    }

    /// The entries of an open directory after `offset`, from its snapshot.
    private func entries(
        _ node: NodeID, _ handle: FUSE.FileHandle, after offset: UInt64
    ) throws(Errno) -> [DirectoryEntry] {
        let entries = try state.withLock { state throws(Errno) -> [DirectoryEntry] in
            if var open = state.directories[handle.rawValue], let entries = open.entries,
                !(offset == 0 && open.served)
            {
                open.served = true
                state.directories[handle.rawValue] = open
                return entries
            }
            // The first readdir (or a rewinddir, or no handle): list afresh.
            let fresh = try listDirectory(&state, try self.node(&state, node))
            state.directories[handle.rawValue]?.entries = fresh
            state.directories[handle.rawValue]?.served = true
            return fresh
        }
        // Entries are in cookie order: the ones after `offset` start where a binary search says,
        // so that reading a big directory a buffer at a time is not quadratic.
        var low = 0
        var high = entries.count
        while low < high {
            let middle = (low + high) / 2
            if entries[middle].cookie <= offset { low = middle + 1 } else { high = middle }
        }
        return Array(entries[low...])
    }

    public func readdir(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        reply: consuming ReplyDirectory
    ) {
        do throws(Errno) {
            for entry in try entries(node, handle, after: offset) {
                let full = reply.add(
                    ino: entry.attributes.ino, offset: entry.cookie, type: entry.attributes.type,
                    name: entry.name)
                if full { break }
            }
            reply.finish()
        } catch { reply.error(error) }
    }

    public func readdirplus(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        reply: consuming ReplyDirectoryPlus
    ) {
        do throws(Errno) {
            if offset == 0 { try texts.showChildrenAsText(node) }
            for entry in try entries(node, handle, after: offset) {
                let full = reply.add(
                    entry.ino, in: table, attributes: entry.attributes, offset: entry.cookie,
                    name: entry.name, attributeTimeout: configuration.attributeTimeout,
                    entryTimeout: configuration.entryTimeout)
                if full { break }
            }
            reply.finish()
        } catch { reply.error(error) }
    }

    public func releasedir(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, reply: consuming ReplyEmpty
    ) {
        _ = state.withLock { $0.directories.removeValue(forKey: handle.rawValue) }
        reply.ok()
    }

    public func fsyncdir(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, flags: FsyncFlags,
        reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            let directory = try resolver.resolve(node)
            try saving.synchronize(
                directory.flatMap { directory in state.withLock { self.document(&$0, of: directory) } })
            reply.ok()
        } catch { reply.error(error) }
    }
}
