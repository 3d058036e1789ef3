import FUSE
import Foundation
import Threading

/// What the kernel must forget after a change it did not make itself.
enum Notice {
    case inode(UInt64)
    /// The inode's attributes only; its pages stay.
    case attributes(UInt64)
    case entry(parent: UInt64, name: FUSE.FileName)
    case delete(parent: UInt64, child: UInt64, name: FUSE.FileName)
}

extension MountRoom {
    /// Tells the kernel what changed (from the calling thread, never inside a request handler).
    /// Queues `notices` for the kernel; with `waitingUpTo`, returns once the kernel has taken
    /// them (or the time is up). A request handler waits only where the kernel holds nothing an
    /// invalidation needs (an open, which holds no page of the file): an invalidation can need
    /// a lock the kernel holds for the request, so the wait is bounded all the same.
    func send(_ notices: [Notice], waitingUpTo timeout: Duration? = nil, again: Bool = true) {
        guard !notices.isEmpty, let notifier = state.withLock({ $0.notifier }) else { return }
        if again {
            // A lookup the kernel sent before this change and answers after it instantiates its
            // inode with the old attributes, which an invalidation sent meanwhile (the kernel did
            // not know the inode yet) cannot reach: they would stand until the attribute timeout.
            // The same invalidations once more, a moment later, catch such a reply.
            let repeated = notices.filter { if case .delete = $0 { false } else { true } }
            if !repeated.isEmpty {
                DispatchQueue.global().asyncAfter(deadline: .now() + 0.25) { [self] in
                    send(repeated, again: false)
                }
            }
        }
        var sentInodes: Set<UInt64> = []
        let taken = WorkCount()
        let done: Notifier.Completion?
        if timeout != nil {
            done = { @Sendable _ in taken.leave() }
        } else {
            done = nil
        }
        func track() { if done != nil { taken.enter() } }
        for notice in notices {
            switch notice {
            case .inode(let ino):
                guard sentInodes.insert(ino).inserted else { continue }
                if ino == mountRootInode {
                    track()
                    notifier.invalidateInode(.root, completion: done)
                } else {
                    // A renewed file's old inode too: open files' pages and attributes.
                    for node in table.nodes(for: ino) {
                        track()
                        notifier.invalidateInode(node, completion: done)
                    }
                }
            case .attributes(let ino):
                for node in ino == mountRootInode ? [NodeID.root] : table.nodes(for: ino) {
                    track()
                    notifier.invalidateInode(node, offset: -1, completion: done)
                }
            case .entry(let parent, let name):
                let parentNode = parent == mountRootInode ? NodeID.root : table.node(for: parent)
                if let parentNode {
                    track()
                    notifier.invalidateEntry(parent: parentNode, name: name, completion: done)
                }
            case .delete(let parent, let child, let name):
                let parentNode = parent == mountRootInode ? NodeID.root : table.node(for: parent)
                guard let parentNode else { continue }
                track()
                if let childNode = table.node(for: child) {
                    notifier.delete(parent: parentNode, child: childNode, name: name, completion: done)
                } else {
                    notifier.invalidateEntry(parent: parentNode, name: name, completion: done)
                }
            }
        }
        if let timeout {
            if !taken.wait(timeout: timeout) {
                logger.debug("the kernel had not taken every invalidation after \(timeout)")
            }
        }
    }

    /// Makes the kernel ask for the file's attributes again, keeping its cached pages: after a
    /// write or open whose reply carries no attributes changed them.
    func attributesChanged(_ file: ViewNode) {
        guard let notifier = state.withLock({ $0.notifier }) else { return }
        for node in table.nodes(for: file.ino) { notifier.invalidateInode(node, offset: -1) }
    }

    /// With the writeback cache the kernel keeps a file's size and times and ignores the
    /// daemon's, so a file whose contents changed other than through it gets a new kernel
    /// inode: its names are invalidated and their next lookup makes that inode. Open files keep
    /// the old one, and reads through them keep to what they opened; an open of the old one is
    /// refused with `ESTALE`, which makes the kernel look the name up again, unless the old
    /// inode's size, `keptSize` (the file's before the change), is still the file's
    /// (``DocumentFileSystem/open(_:node:flags:reply:)``).
    func renew(_ node: ViewNode, _ notices: inout [Notice], keptSize: Int64) {
        guard view.writeback.load(ordering: .relaxed), node.kind == .regularFile else { return }
        let file = node.linkOf ?? node
        let old = table.node(for: file.ino)
        var retired = table.retire(file.ino)
        if retired, let old {
            // A few are enough: the kernel opens an old inode only in the moment after a change.
            if file.retiredSizes.count >= 8, let oldest = file.retiredSizes.keys.min() {
                file.retiredSizes[oldest] = nil
            }
            file.retiredSizes[old.rawValue] = keptSize
        }
        for key in file.kernelAliases where table.retire(key) {
            retired = true
            notices.append(.inode(key))
        }
        guard retired else { return }
        for name in [file] + Array(file.aliases.values) where name.linked {
            notices.append(.entry(parent: name.parent?.ino ?? mountRootInode, name: name.name))
        }
    }
}
