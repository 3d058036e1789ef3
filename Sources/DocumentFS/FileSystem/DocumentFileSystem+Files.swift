import DocumentEngine
import FUSE
import Foundation
import Synchronization
import SystemPackage
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// Reading and writing files.
extension DocumentFileSystem {
    public func open(_ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen) {
        do throws(Errno) {
            if configuration.readOnly && (flags.isWritable || flags.contains(.truncate)) {
                throw .readOnlyFileSystem
            }
            guard let file = try resolver.resolve(node) else { throw .isDirectory }
            if flags.isWritable || flags.contains(.truncate) { try conflictCopies.refuseConflict(file) }
            // Close-to-open: an open sees the document as it is now, even before the observer
            // has noticed another process's save.
            let reloaded = try reconciler.revalidate(file)
            let changedElsewhere = state.withLock { _ in
                (file.contents?.generation).map { $0 != file.openedGeneration } ?? false
            }
            if reloaded || changedElsewhere {
                // Another mount changed the file since it was last opened here, and the kernel
                // may keep the attributes it took in a moment between two of that mount's saves
                // (a permission check's GETATTR), the invalidation of the reload still on its
                // way: a read would stop at that old size. The notices go in order, so once
                // this one is taken, every earlier one for the file is. An attributes-only
                // invalidation needs no lock the kernel holds for an open.
                let ino = (file.linkOf ?? file).ino
                send([.attributes(ino)], waitingUpTo: .seconds(1), again: false)
            }
            try texts.showAsText(file)
            // The kernel's inode of a file changed elsewhere has the old size, which the
            // writeback cache never corrects (``renew``): ESTALE makes the kernel look the name
            // up again, which gives the new inode, and open that. An old inode whose size is
            // still right is opened as it is, its cached pages dropped. The kernel retries an
            // open only once, and a file another mount keeps rewriting may change again between
            // that lookup and the open: the retry is never refused, but opened for direct I/O,
            // whose reads and writes the daemon answers whatever size the kernel keeps.
            var oldInode = false
            var direct = false
            if view.writeback.load(ordering: .relaxed), !table.isCurrent(node) {
                let now = ContinuousClock.now
                let refuse = state.withLock { state -> Bool in
                    let shown = file.linkOf ?? file
                    oldInode = true
                    guard let kept = shown.retiredSizes[node.rawValue], kept == shown.contents?.size else {
                        if let refused = state.staleRefusals[context.pid], now - refused < .seconds(1) {
                            state.staleRefusals[context.pid] = nil
                            direct = true
                            return false
                        }
                        if state.staleRefusals.count >= 64 {
                            state.staleRefusals = state.staleRefusals.filter { now - $0.value < .seconds(1) }
                        }
                        state.staleRefusals[context.pid] = now
                        return true
                    }
                    return false
                }
                if refuse {
                    logger.debug(
                        "open of \(file.name.string)'s old inode \(node.rawValue), whose size changed: ESTALE"
                    )
                    throw .staleNFSFileHandle
                }
            }
            let truncated = flags.contains(.truncate) && flags.isWritable
            if truncated { try truncate(file, to: 0) }
            if context.killsSetIDBits { killSetIDBits(context, file) }
            let (handle, keep) = try state.withLock { state throws(Errno) in
                guard file.kind == .regularFile, let contents = file.contents else { throw .isDirectory }
                let keep = !oldInode && file.openedGeneration == contents.generation
                file.openedGeneration = contents.generation
                file.openHandles += 1
                let handle = state.nextHandle
                state.nextHandle += 1
                state.files[handle] = OpenFile(
                    node: file, writable: flags.isWritable, generation: contents.generation,
                    snapshot: contents.isModified ? nil : contents.base,
                    writers: truncated || (flags.isWritable && view.writeback.load(ordering: .relaxed))
                        ? [context.pid, threadGroup(of: context.pid)] : [])
                return (handle, keep)
            }
            reply.opened(FUSE.FileHandle(handle), options: direct ? [.directIO] : keep ? [.keepCache] : [])
        } catch { reply.error(error) }
    }

    public func read(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64, size: Int,
        reply: consuming ReplyData
    ) {
        let plan: FileContents.ReadPlan
        do { plan = try readPlan(handle: handle, offset: offset, size: size) } catch {
            reply.error(error)
            return
        }
        let buffer = Self.buffer(for: plan)
        defer { buffer.deallocate() }
        do { try fill(buffer, from: plan) } catch {
            reply.error(error)
            return
        }
        reply.data(UnsafeRawBufferPointer(buffer))
    }

    /// Up to `size` bytes of an open file from `offset`.
    func readBytes(handle: FUSE.FileHandle, offset: UInt64, size: Int) throws(Errno) -> [UInt8] {
        try read(readPlan(handle: handle, offset: offset, size: size)) { [UInt8]($0) }
    }

    /// Where the bytes of a read of an open file come from, decided under the lock; the spill and
    /// the store are read without it.
    func readPlan(handle: FUSE.FileHandle, offset: UInt64, size: Int) throws(Errno) -> FileContents.ReadPlan {
        try state.withLock { state throws(Errno) -> FileContents.ReadPlan in
            guard let file = state.files[handle.rawValue], let contents = file.node.contents else {
                throw .badFileDescriptor
            }
            if file.lockLost { throw .ioError }
            if file.generation != contents.generation, let snapshot = file.snapshot {
                // Another process replaced the file after this open: keep to what it opened.
                let end = min(Int64(clamping: offset) + Int64(size), snapshot.size)
                guard end > Int64(clamping: offset) else { return FileContents.ReadPlan() }
                let count = Int(end - Int64(offset))
                return FileContents.ReadPlan(
                    count: count,
                    store: [StoreRead(source: snapshot, offset: Int64(offset), count: count, destination: 0)])
            }
            return contents.planRead(offset: Int64(clamping: offset), count: size)
        }
    }

    /// Changes a file's bytes, holding the file's ``ViewNode/changes`` (the caller holds it).
    ///
    /// The chunks the change must keep (`keeping`, asked under the lock) are read from the store
    /// without the lock; the change is planned under it; its spill I/O (taking those chunks in,
    /// then `io` into the layer) runs without it; and it is committed under it, with `commit`,
    /// if the file still writes into that layer. Otherwise (another process's save replaced the
    /// file) what it wrote outside the layer's chunks is zeroed and it runs again.
    func changeContents<T>(
        _ file: ViewNode, keeping: (FileContents) -> [Int], writing range: Range<Int64>?,
        truncating newSize: Int64? = nil, io: (SpillBytes) throws(Errno) -> Void,
        commit: (inout State, FileContents) throws(Errno) -> T
    ) throws(Errno) -> T {
        var fetched: [Int: (base: ContentBase, data: Data)] = [:]
        var refused = 0
        while true {
            let planned = try state.withLock {
                _ throws(Errno) -> (FileContents, FileContents.PlannedChange) in
                guard let contents = file.contents else { throw .isDirectory }
                return (
                    contents,
                    contents.planChange(
                        keeping: keeping(contents), writing: range, truncating: newSize, fetched: fetched)
                )
            }
            let plan: FileContents.ChangePlan
            switch planned.1 {
            case .fetch(let missing):
                // Runs of consecutive pages are one store read each.
                let page = planned.0.pageSize
                var index = 0
                while index < missing.count {
                    var end = index + 1
                    while end < missing.count, missing[end].page == missing[end - 1].page + 1,
                        missing[end].base == missing[index].base
                    {
                        end += 1
                    }
                    let base = missing[index].base
                    let start = Int64(missing[index].page) * Int64(page)
                    let bytes = try baseBytes(
                        base, offset: start, count: Int(min(Int64((end - index) * page), base.size - start)))
                    for (number, item) in missing[index..<end].enumerated() {
                        let from = min(bytes.count, number * page)
                        let to = min(bytes.count, from + page)
                        fetched[item.page] = (
                            base, bytes.subdata(in: bytes.startIndex + from..<bytes.startIndex + to)
                        )
                    }
                    index = end
                }
                continue
            case .ready(let ready):
                plan = ready
            }
            let contents = planned.0
            do {
                try plan.copyPages()
                try io(plan.layer)
            } catch {
                let undone = plan.undo()
                state.withLock { _ in contents.changeAbandoned(plan, undone: undone) }
                throw error
            }
            let result = try state.withLock { state throws(Errno) -> T? in
                guard file.contents === contents, contents.commit(plan) else { return nil }
                return try commit(&state, contents)
            }
            if let result { return result }
            let undone = plan.undo()
            state.withLock { _ in contents.changeAbandoned(plan, undone: undone) }
            refused += 1
            if refused == 1000 {
                // Each refusal needs another process's save to land during this change's I/O:
                // not a live lock unless something is badly wrong.
                logger.error("a change of \(file.name.string) was refused 1000 times")
                throw .ioError
            }
        }
    }

    /// Writes straight from libfuse's buffer: the spill write is done before this returns.
    public func write(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        bytes: UnsafeRawBufferPointer, info: WriteInfo, reply: consuming ReplyWrite
    ) {
        do throws(Errno) {
            try writeBytes(
                context, handle: handle, offset: offset, data: bytes, isWritePage: info.isWritePage,
                killingSetIDBits: context.killsSetIDBits)
            reply.written(bytes.count)
        } catch { reply.error(error) }
    }

    /// Writes bytes into an open file's top layer, taking in first the chunks it covers in part.
    func writeBytes(
        _ context: RequestContext, handle: FUSE.FileHandle, offset: UInt64, data: UnsafeRawBufferPointer,
        isWritePage: Bool, killingSetIDBits: Bool
    ) throws(Errno) {
        let (file, known) = try state.withLock { state throws(Errno) -> (ViewNode, Bool) in
            guard let open = state.files[handle.rawValue] else { throw .badFileDescriptor }
            if open.lockLost { throw .ioError }
            // A page-cache write (shared mmap) may carry another open's handle.
            if !open.writable && !isWritePage { throw .badFileDescriptor }
            return (open.node, isWritePage || open.writers.contains(context.pid))
        }
        var killed = false
        defer { if killed { attributesChanged(file) } }
        let dropsGroup = killingSetIDBits && dropsSetGroupID(context, file)
        // The request names the writing thread; its process is what a later close matches.
        let writer = known ? nil : threadGroup(of: context.pid)
        let start = Int64(clamping: offset)
        let end = start + Int64(data.count)
        file.changes.lock()
        defer { file.changes.unlock() }
        try changeContents(
            file, keeping: { $0.partiallyCoveredPages(offset: start, count: data.count) },
            writing: start..<end,
            io: { layer throws(Errno) in try layer.write(data, at: start) },
            commit: { state, contents throws(Errno) in
                contents.wrote(start..<end)
                contents.prepare { store.prepareContents(reading: $0) }
                // With the writeback cache the kernel keeps the times of the write(2) calls and
                // sends them itself (a setattr) once it has written the pages.
                if !(isWritePage && view.writeback.load(ordering: .relaxed)) {
                    let now = Timestamp.now
                    file.record.modified = now
                    file.record.changed = now
                }
                state.files[handle.rawValue]?.wrote = true
                if killingSetIDBits { killed = killSetIDBits(&state, file, droppingGroup: dropsGroup) }
                if let writer {
                    state.files[handle.rawValue]?.writers.insert(writer)
                    state.files[handle.rawValue]?.writers.insert(context.pid)
                }
                changed(&state, file)
            })
    }

    /// `copy_file_range(2)` within the mount. A whole saved file copied into an empty one shares
    /// its chunks: the copy's contents are the source's stored version, and its save names them
    /// (``ContentUpdate/derived(from:size:chunks:source:)``), so no byte is read or written.
    /// Any other range is copied here, a megabyte at a time, as the caller's reads and writes
    /// would (answering `ENOSYS` would make the kernel stop asking for the whole mount).
    public func copyFileRange(
        _ context: RequestContext, nodeIn: NodeID, handleIn: FUSE.FileHandle, offsetIn: UInt64,
        nodeOut: NodeID, handleOut: FUSE.FileHandle, offsetOut: UInt64, length: Int, flags: UInt32,
        reply: consuming ReplyWrite
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            guard flags == 0 else { throw .invalidArgument }
            if let shared = try shareContents(
                context, handleIn: handleIn, offsetIn: offsetIn, handleOut: handleOut, offsetOut: offsetOut,
                length: length)
            {
                reply.written(shared)
                return
            }
            var done = 0
            while done < length {
                let piece = try readBytes(
                    handle: handleIn, offset: offsetIn + UInt64(done), size: min(1 << 20, length - done))
                if piece.isEmpty { break }
                // The kernel leaves set-ID bits to the filesystem here too, but sends no flag
                // for copies: a caller other than root stands for one without CAP_FSETID.
                try withRawBytes(piece) { raw throws(Errno) in
                    try writeBytes(
                        context, handle: handleOut, offset: offsetOut + UInt64(done), data: raw,
                        isWritePage: false, killingSetIDBits: context.uid != 0)
                }
                done += piece.count
            }
            reply.written(done)
        } catch { reply.error(error) }
    }

    /// Makes the empty file open as `handleOut` the copy of the whole saved file open as
    /// `handleIn`, sharing its stored chunks; nil when the copy is not that.
    func shareContents(
        _ context: RequestContext, handleIn: FUSE.FileHandle, offsetIn: UInt64, handleOut: FUSE.FileHandle,
        offsetOut: UInt64, length: Int
    ) throws(Errno) -> Int? {
        guard offsetIn == 0, offsetOut == 0 else { return nil }
        let writer = threadGroup(of: context.pid)
        return try state.withLock { state throws(Errno) -> Int? in
            guard let input = state.files[handleIn.rawValue], let output = state.files[handleOut.rawValue]
            else {
                throw .badFileDescriptor
            }
            guard output.writable else { throw .badFileDescriptor }
            let source = input.node
            let target = output.node
            guard source !== target, let from = source.contents, let to = target.contents else { return nil }
            // The source as stored (no unsaved bytes, a saved version), all of it, into nothing.
            // A text view's bytes are not the stored ones, and a file stored as a property list
            // must be compiled: both are copied byte by byte.
            guard from.base.text == nil, to.propertyList == nil else { return nil }
            guard !from.isModified, let version = from.base.version, from.base.size > 0,
                input.generation == from.generation, Int64(length) >= from.size, to.size == 0, !to.isModified,
                target.conflict == nil
            else { return nil }
            to.reset(to: ContentBase(node: from.base.node, version: version, size: from.size))
            let now = Timestamp.now
            target.record.modified = now
            target.record.changed = now
            state.files[handleOut.rawValue]?.wrote = true
            state.files[handleOut.rawValue]?.writers.insert(writer)
            state.files[handleOut.rawValue]?.writers.insert(context.pid)
            changed(&state, target)
            return Int(from.size)
        }
    }

    /// Sets a file's size.
    func truncate(_ file: ViewNode, to size: Int64) throws(Errno) {
        guard size >= 0 else { throw .invalidArgument }
        file.changes.lock()
        defer { file.changes.unlock() }
        var cut: Int?
        var pageSize = 0
        let (layer, zero) = try changeContents(
            file,
            keeping: { contents in
                pageSize = contents.pageSize
                cut = contents.pageCutBy(size)
                return cut.map { [$0] } ?? []
            },
            writing: nil, truncating: size,
            io: { layer throws(Errno) in
                // The chunk the new end cuts reads as zeros past it before the size changes: a
                // save waits for this change, and a read racing it may see those zeros early.
                if let cut {
                    let end = Int64(cut + 1) * Int64(pageSize)
                    try layer.zero(at: size, length: end - size)
                }
            },
            commit: { state, contents throws(Errno) in
                let result = contents.truncated(to: size)
                let now = Timestamp.now
                file.record.modified = now
                file.record.changed = now
                changed(&state, file)
                return result
            })
        // Chunks no longer in the layer, so nothing reads them; zeroed before the next change,
        // which may take them in again. If that fails, the layer takes no more writes.
        for range in zero {
            do {
                try layer.zero(at: range.lowerBound, length: Int64(range.count))
            } catch {
                state.withLock { _ in file.contents?.seal(layer) }
                throw error
            }
        }
    }

    /// Whether the caller is outside the group of a set-group-ID file that is not
    /// group-executable, whose bit then goes too, as `setattr_should_drop_sgid` decides (root
    /// standing for `CAP_FSETID`). Only then is /proc read, without the lock.
    func dropsSetGroupID(_ context: RequestContext, _ file: ViewNode) -> Bool {
        let (permissions, gid) = state.withLock { _ in (file.record.permissions, file.record.gid) }
        guard permissions & Int(S_ISGID) != 0, permissions & Int(S_IXGRP) == 0 else { return false }
        if context.uid == 0 || context.gid == gid { return false }
        return !groups(of: context.pid).contains(gid)
    }

    /// Clears a file's set-ID bits (``killingSetIDBits(_:droppingGroup:)``) for a request that
    /// carries no attributes back, and has the kernel fetch them again if they changed.
    func killSetIDBits(_ context: RequestContext, _ file: ViewNode) {
        let dropsGroup = dropsSetGroupID(context, file)
        if state.withLock({ state in killSetIDBits(&state, file, droppingGroup: dropsGroup) }) {
            attributesChanged(file)
        }
    }

    /// Clears a file's set-ID bits under the lock. Returns whether the mode changed: the kernel,
    /// which keeps the attributes it was given, then has to be told (``attributesChanged(_:)``).
    func killSetIDBits(_ state: inout State, _ file: ViewNode, droppingGroup: Bool) -> Bool {
        let permissions = Self.killingSetIDBits(file.record.permissions, droppingGroup: droppingGroup)
        guard file.kind != .directory, permissions != file.record.permissions else { return false }
        file.record.permissions = permissions
        file.record.changed = .now
        changed(&state, file)
        return true
    }

    /// The mode without set-user-ID, and without set-group-ID if the file is group-executable
    /// or `droppingGroup` (``dropsSetGroupID(_:_:)``), as Linux leaves it when a caller without
    /// `CAP_FSETID` writes or truncates a file, or anyone chowns one
    /// (``RequestContext/killsSetIDBits``).
    static func killingSetIDBits(_ permissions: Int, droppingGroup: Bool) -> Int {
        var result = permissions & ~Int(S_ISUID)
        if droppingGroup || result & Int(S_IXGRP) != 0 { result &= ~Int(S_ISGID) }
        return result
    }

    public func flush(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, lockOwner: LockOwner,
        reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            // Close of a dirty file by a process that wrote it is a save point; its error is what
            // close(2) returns.
            let closer = threadGroup(of: context.pid)
            // A close releases the process's POSIX locks on the file, whichever descriptor took
            // them; the document's changes are saved first, for whoever takes them next.
            var locked = false
            if let file = state.withLock({ state in state.files[handle.rawValue]?.node }) {
                try locks.releaseAll(file, owners: [Int64(bitPattern: lockOwner.rawValue)])
                locked = locks.holdsLocks(on: file)
            }
            let document = state.withLock { state -> DocumentState? in
                // The kernel wrote the file's pages back before this request, whoever closes.
                if let open = state.files[handle.rawValue] { open.node.contents?.sizeAhead = false }
                guard let open = state.files[handle.rawValue], open.wrote || open.node.contentsModified,
                    open.writers.contains(closer) || open.writers.contains(context.pid),
                    isPersisted(open.node)
                else { return nil }
                state.files[handle.rawValue]?.wrote = false
                return self.document(&state, of: open.node)
            }
            if let document {
                // A property list shown as text is checked now: a close is where an editor hears
                // that its text was refused.
                if let file = state.withLock({ state in state.files[handle.rawValue]?.node }) {
                    try texts.checkText(file)
                }
                if configuration.closeToOpen || locked {
                    // Another mount's open after this close sees the change (close-to-open),
                    // and whoever takes this mount's lock next reads it: saved before the reply.
                    // Its error is this close's; the changes stay pending and are saved again.
                    _ = try saving.save(document, durable: false)
                } else if let failure = saving.commitSoon(document, reporting: true) {
                    // A save of the document that failed since the last report is what close
                    // reports, once; the changes stay pending and are saved again.
                    throw failure
                }
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    public func fsync(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, flags: FsyncFlags,
        reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            if state.withLock({ state in state.files[handle.rawValue]?.lockLost == true }) { throw .ioError }
            let document = state.withLock { state -> DocumentState? in
                guard let open = state.files[handle.rawValue], isPersisted(open.node) else { return nil }
                // The kernel wrote every page it held of the file back before this request:
                // what the mount has of it is whole again, and a save may take it (see `prepare`).
                open.node.contents?.sizeAhead = false
                return self.document(&state, of: open.node)
            }
            if document != nil, let file = state.withLock({ state in state.files[handle.rawValue]?.node }) {
                try texts.checkText(file)
            }
            try saving.synchronize(document)
            reply.ok()
        } catch { reply.error(error) }
    }

    public func release(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, info: ReleaseInfo,
        reply: consuming ReplyEmpty
    ) {
        // The open's own locks (flock, open file description locks) go with it. An owner that a
        // newer open took locks with is the kernel's address of a new file, not this one's.
        let held = state.withLock { state -> (ViewNode, Set<Int64>)? in
            guard let open = state.files[handle.rawValue], !open.lockOwners.isEmpty else { return nil }
            var owners = open.lockOwners
            for (key, other) in state.files where key != handle.rawValue { owners.subtract(other.lockOwners) }
            return owners.isEmpty ? nil : (open.node, owners)
        }
        if let held {
            do throws(Errno) { try locks.releaseAll(held.0, owners: held.1) } catch {
                logger.warning("releasing the locks of \(held.0.name.string) at its close failed: \(error)")
            }
        }
        let dropped = state.withLock { state -> [SpillLayer] in
            guard let open = state.files.removeValue(forKey: handle.rawValue) else { return [] }
            open.node.openHandles -= 1
            if !open.node.linked && open.node.openHandles == 0 && table.node(for: open.node.ino) == nil {
                state.nodes[open.node.ino] = nil
            }
            return open.node.openHandles == 0 ? open.node.contents?.dropClean() ?? [] : []
        }
        withExtendedLifetime(dropped) {}
        reply.ok()
    }

    /// `fallocate(2)`: every mode the kernel passes to a FUSE file system (allocate, KEEP_SIZE,
    /// PUNCH_HOLE, ZERO_RANGE; it answers COLLAPSE_RANGE and INSERT_RANGE with EOPNOTSUPP itself).
    /// Space needs no reserving (the store keeps contents, not blocks), so allocation only grows
    /// the file; zeroing and hole punching write zeros, which the store keeps as holes.
    public func fallocate(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, mode: FallocateMode,
        offset: UInt64, length: UInt64, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            let file = try state.withLock { state throws(Errno) -> ViewNode in
                guard let open = state.files[handle.rawValue] else { throw .badFileDescriptor }
                guard open.writable else { throw .badFileDescriptor }
                state.files[handle.rawValue]?.wrote = true
                return open.node
            }
            guard length > 0, offset <= UInt64(Int64.max), length <= UInt64(Int64.max) - offset else {
                throw .invalidArgument
            }
            let start = Int64(offset)
            let end = start + Int64(length)
            let size = state.withLock { _ in file.size }
            switch mode {
            case []:
                if end > size { try truncate(file, to: end) }
            case [.keepSize]:
                break
            case [.punchHole, .keepSize]:
                try zero(file, from: start, to: min(end, size))
            case [.zeroRange], [.zeroRange, .keepSize]:
                try zero(file, from: start, to: min(end, size))
                if !mode.contains(.keepSize), end > size { try truncate(file, to: end) }
            default:
                throw .notSupported
            }
            // As for copies: the kernel sends no flag, and root stands for CAP_FSETID.
            if context.uid != 0 { killSetIDBits(context, file) }
            reply.ok()
        } catch { reply.error(error) }
    }

    /// Writes zeros over `start..<stop`, a chunk at a time.
    func zero(_ file: ViewNode, from start: Int64, to stop: Int64) throws(Errno) {
        file.changes.lock()
        defer { file.changes.unlock() }
        var at = start
        while at < stop {
            let n = Int(min(Int64(chunkSize) - at % Int64(chunkSize), stop - at))
            let position = at
            try changeContents(
                file, keeping: { $0.partiallyCoveredPages(offset: position, count: n) },
                writing: position..<position + Int64(n),
                io: { layer throws(Errno) in try layer.zero(at: position, length: Int64(n)) },
                commit: { state, contents throws(Errno) in
                    contents.wrote(position..<position + Int64(n))
                    changed(&state, file)
                })
            at += Int64(n)
        }
    }

    // MARK: - Attributes

    public func setattr(
        _ context: RequestContext, node: NodeID, changes: SetAttributes, reply: consuming ReplyAttr
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            guard let target = try resolver.resolve(node) else {
                // The mount root's attributes come from the store; nothing to keep.
                throw .notPermitted
            }
            // The table's lock last: the kernel sends such a setattr after every unlink and rename.
            if view.writeback.load(ordering: .relaxed), changes.mtime != nil, changes.atime == nil,
                changes.size == nil, changes.permissions == nil, changes.uid == nil, changes.gid == nil,
                !table.isCurrent(node)
            {
                // The times the kernel kept for an inode the mount has since replaced (``renew``),
                // sent after a rename or unlink touched it: they are not the file's any more.
                let attrs = state.withLock { _ in self.attributes(target) }
                reply.attributes(attrs, timeout: configuration.attributeTimeout)
                return
            }
            try conflictCopies.refuseConflict(target)
            if target.role != nil { throw .permissionDenied }
            if let size = changes.size {
                guard target.kind == .regularFile else { throw .isDirectory }
                // A write through the handle (ftruncate), or through every one the file has
                // open for writing (truncate(2)): marked before the size changes, so that no
                // save takes the new size without the bytes the kernel still holds for it.
                let writer = threadGroup(of: context.pid)
                state.withLock { state in
                    if let handle = changes.handle {
                        state.files[handle.rawValue]?.wrote = true
                        state.files[handle.rawValue]?.writers.formUnion([writer, context.pid])
                    }
                    if view.writeback.load(ordering: .relaxed),
                        state.files.values.contains(where: { $0.node === target && $0.writable })
                    {
                        target.contents?.sizeAhead = true
                    }
                }
                try truncate(target, to: Int64(clamping: size))
            }
            let dropsGroup = context.killsSetIDBits && dropsSetGroupID(context, target)
            let attrs = state.withLock { state -> FileAttributes in
                let now = Timestamp.now
                var record = target.record
                if let permissions = changes.permissions {
                    record.permissions = Int(permissions.rawValue & 0o7777)
                }
                if let uid = changes.uid { record.uid = uid }
                if let gid = changes.gid { record.gid = gid }
                if context.killsSetIDBits, target.kind != .directory {
                    record.permissions = Self.killingSetIDBits(record.permissions, droppingGroup: dropsGroup)
                }
                switch changes.atime {
                case .now: record.accessed = now
                case .time(let time): record.accessed = Timestamp(time)
                case nil: break
                }
                switch changes.mtime {
                case .now: record.modified = now
                case .time(let time): record.modified = Timestamp(time)
                case nil: break
                }
                if changes.permissions != nil || changes.uid != nil || changes.gid != nil
                    || changes.atime != nil || changes.mtime != nil
                    || record.permissions != target.record.permissions
                {
                    record.changed = changes.ctime.map(Timestamp.init) ?? now
                }
                var sameButChanged = record
                sameButChanged.changed = target.record.changed
                if sameButChanged == target.record {
                    // Only the change time, which the kernel sends after a rename, link or unlink
                    // with the writeback cache. The mount set its own change time then; the
                    // kernel's is shown but is no change to save.
                    target.record = record
                } else {
                    target.record = record
                    changed(&state, target)
                }
                return self.attributes(target)
            }
            reply.attributes(attrs, timeout: configuration.attributeTimeout)
        } catch { reply.error(error) }
    }

    // MARK: - Extended attributes

    /// The most bytes one attribute value may have (Linux's XATTR_SIZE_MAX).
    static let maximumXattrSize = 65536

    public func getxattr(
        _ context: RequestContext, node: NodeID, name: String, reply: consuming ReplyXattr
    ) {
        // Only user. names exist; every other probe is answered from memory. No ACL is ENODATA:
        // the kernel caches that answer (FUSE_POSIX_ACL) and takes an error for a broken ACL.
        // The other namespaces are not supported, as setxattr says: `ls -l` stops asking each
        // file for its SELinux label once the mount answers ENOTSUP, a round trip per entry.
        guard name.hasPrefix("user.") else {
            reply.error(name.hasPrefix("system.posix_acl_") ? .noData : .notSupported)
            return
        }
        do throws(Errno) {
            let value = try state.withLock { state throws(Errno) -> Data in
                guard let n = try self.node(&state, node), let value = n.record.extendedAttributes[name]
                else {
                    throw .noData
                }
                return value
            }
            reply.value(Array(value))
        } catch { reply.error(error) }
    }

    public func listxattr(_ context: RequestContext, node: NodeID, reply: consuming ReplyXattr) {
        do throws(Errno) {
            let names = try state.withLock { state throws(Errno) -> [String] in
                guard let n = try self.node(&state, node) else { return [] }
                return n.record.extendedAttributes.keys.sorted()
            }
            reply.names(names)
        } catch { reply.error(error) }
    }

    public func setxattr(
        _ context: RequestContext, node: NodeID, name: String, value: [UInt8], flags: XattrFlags,
        reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            // Only user. attributes are kept with wrappers; ENOTSUP (not EPERM) lets cp and
            // editors carry on without them (docs/design/fuse-notes.md §3.5).
            guard name.hasPrefix("user."), name.utf8.count > 5 else { throw .notSupported }
            guard name.utf8.count <= 255 else { throw .outOfRange }
            guard value.count <= Self.maximumXattrSize else { throw .argListTooLong }
            try state.withLock { state throws(Errno) in
                guard let n = try self.node(&state, node) else { throw .notSupported }
                try conflictCopies.refuseConflict(n)
                let exists = n.record.extendedAttributes[name] != nil
                if flags.contains(.create) && exists { throw .fileExists }
                if flags.contains(.replace) && !exists { throw .noData }
                n.record.extendedAttributes[name] = Data(value)
                n.record.changed = .now
                changed(&state, n)
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    public func removexattr(
        _ context: RequestContext, node: NodeID, name: String, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            guard name.hasPrefix("user.") else { throw .noData }
            try state.withLock { state throws(Errno) in
                guard let n = try self.node(&state, node), n.record.extendedAttributes[name] != nil else {
                    throw .noData
                }
                try conflictCopies.refuseConflict(n)
                n.record.extendedAttributes[name] = nil
                n.record.changed = .now
                changed(&state, n)
            }
            reply.ok()
        } catch { reply.error(error) }
    }
}

/// The process (thread group) of a thread: FUSE requests carry the calling thread's id.
///
/// Asked on every create, write and close. Reading `/proc/<tid>/status` (the kernel formats the
/// whole file) was a tenth of the daemon's CPU while small files were created, so answers are
/// kept for a second: a thread id names another thread only after it exited and the kernel
/// handed out every other id, and a wrong answer costs at most a save at a close, or one left
/// to the quiet interval.
func threadGroup(of thread: Int32) -> Int32 {
    guard thread > 0 else { return thread }
    let now = ContinuousClock.now
    if let known = threadGroups.withLock({ $0[thread] }), now - known.seen < .seconds(1) {
        return known.group
    }
    let group = readThreadGroup(of: thread)
    threadGroups.withLock { cache in
        if cache.count >= 4096 { cache.removeAll(keepingCapacity: true) }
        cache[thread] = (group, now)
    }
    return group
}

/// Thread ids asked about lately, their thread groups, and when they were read.
private let threadGroups = Mutex<[Int32: (group: Int32, seen: ContinuousClock.Instant)]>([:])

/// The supplementary groups of a thread, from its status file (empty if it is gone).
func groups(of thread: Int32) -> [UInt32] {
    guard thread > 0, let value = statusField("Groups", of: thread, within: 16384) else { return [] }
    return value.split(whereSeparator: { $0 == 0x20 || $0 == 0x09 }).compactMap { UInt32(decimal: $0) }
}

private func readThreadGroup(of thread: Int32) -> Int32 {
    // "Tgid:" is the status file's fourth line, after the name (at most 64 bytes escaped 4 times).
    statusField("Tgid", of: thread, within: 1024).flatMap { Int32(decimal: $0) } ?? thread
}

/// The value of `field` in `/proc/<thread>/status` (what follows "Field:" on its line, blanks
/// trimmed), looked for in the file's first `limit` bytes; nil if the thread is gone or the
/// field is not there. Bytes, not text: splitting the file into lines of `String` was the
/// daemon's busiest code while creating small files (benchmark B5).
private func statusField(_ field: String, of thread: Int32, within limit: Int) -> ArraySlice<UInt8>? {
    let fd = open("/proc/\(thread)/status", O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: limit)
    let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
    guard count > 0 else { return nil }
    let key = Array("\n\(field):".utf8)
    var index = 0
    while index + key.count <= count {
        if buffer[index] == key[0], buffer[index..<(index + key.count)].elementsEqual(key) {
            var start = index + key.count
            while start < count, buffer[start] == 0x20 || buffer[start] == 0x09 { start += 1 }
            var end = start
            while end < count, buffer[end] != 0x0A { end += 1 }
            return buffer[start..<end]
        }
        index += 1
    }
    return nil
}

extension FixedWidthInteger {
    /// The value of ASCII decimal digits; nil if there are none, another byte is among them, or
    /// the value does not fit.
    fileprivate init?(decimal digits: ArraySlice<UInt8>) {
        guard !digits.isEmpty else { return nil }
        var value: Self = 0
        for digit in digits {
            guard digit >= 0x30, digit <= 0x39 else { return nil }
            let (times, overflowed) = value.multipliedReportingOverflow(by: 10)
            let (sum, carried) = times.addingReportingOverflow(Self(digit - 0x30))
            guard !overflowed, !carried else { return nil }
            value = sum
        }
        self = value
    }
}
