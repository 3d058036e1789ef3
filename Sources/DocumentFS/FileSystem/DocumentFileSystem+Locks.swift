import FUSE
import SystemPackage
import VersionedStore

/// `flock(2)` and POSIX record locks (`fcntl`, open file description locks too), shared with every
/// mount of the store (``FileLocks``).
extension DocumentFileSystem {
    public func getlk(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, owner: LockOwner, lock: FileLock,
        reply: consuming ReplyLock
    ) {
        do throws(Errno) {
            guard let file = try resolver.resolve(node) else { throw .isDirectory }
            let (start, last) = Self.range(lock)
            if let found = try locks.conflicting(
                file, owner: Int64(bitPattern: owner.rawValue), exclusive: lock.kind == .write, start: start,
                last: last)
            {
                reply.lock(
                    FileLock(
                        kind: found.exclusive ? .write : .read, start: UInt64(found.start),
                        end: found.last == .max ? .max : UInt64(found.last), pid: found.pid))
            } else {
                reply.lock(FileLock(kind: .unlock, start: lock.start, end: lock.end, pid: 0))
            }
        } catch { reply.error(error) }
    }

    public func setlk(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, owner: LockOwner, lock: FileLock,
        wait: Bool, reply: consuming ReplyEmpty
    ) {
        let (start, last) = Self.range(lock)
        changeLock(
            context, node: node, handle: handle, owner: Int64(bitPattern: owner.rawValue), kind: .posix,
            exclusive: lock.kind == .unlock ? nil : lock.kind == .write, start: start, last: last, wait: wait,
            reply: reply)
    }

    public func flock(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, owner: LockOwner,
        operation: FlockOperation, reply: consuming ReplyEmpty
    ) {
        // A flock belongs to the open file description, which is this handle. Not the kernel's
        // owner: that is the address of the kernel's file, which a new open may have again
        // before the old one's (asynchronous) release arrives, and that release would then take
        // the new open's lock.
        let (exclusive, wait): (Bool?, Bool) =
            switch operation {
            case .unlock: (nil, false)
            case .shared(let nonBlocking): (false, !nonBlocking)
            case .exclusive(let nonBlocking): (true, !nonBlocking)
            }
        changeLock(
            context, node: node, handle: handle, owner: Int64(bitPattern: handle.rawValue), kind: .flock,
            exclusive: exclusive, start: 0, last: .max, wait: wait, reply: reply)
    }

    /// Takes (`exclusive` set) or releases (nil) `start...last` of the owner's locks of `kind`.
    private func changeLock(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, owner: Int64, kind: SharedLockKind,
        exclusive: Bool?, start: Int64, last: Int64, wait: Bool, reply: consuming ReplyEmpty
    ) {
        let file: ViewNode
        do throws(Errno) {
            guard let found = try resolver.resolve(node) else { throw .isDirectory }
            file = found
        } catch {
            reply.error(error)
            return
        }
        guard let exclusive else {
            do throws(Errno) {
                try locks.release(file, owner: owner, kind: kind, start: start, last: last)
                reply.ok()
            } catch { reply.error(error) }
            return
        }
        locks.acquire(
            file, handle: handle.rawValue, owner: owner, kind: kind, exclusive: exclusive, start: start,
            last: last, pid: context.pid, wait: wait, reply: reply)
    }

    /// A kernel lock's byte range as the store keeps it: `Int64.max` for "to the end".
    static func range(_ lock: FileLock) -> (start: Int64, last: Int64) {
        let start = Int64(clamping: lock.start)
        let last = lock.end >= UInt64(Int64.max) ? Int64.max : Int64(lock.end)
        return (start, max(start, last))
    }
}
