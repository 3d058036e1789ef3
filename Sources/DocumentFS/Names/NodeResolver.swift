import FUSE
import SystemPackage

/// Kernel node ids resolved to nodes, with what a lookup of their children needs read first: a
/// document's tree, a virtual folder's listing, a conflict version's tree.
struct NodeResolver: MountRoom {
    let view: MountView
    let desktop: DesktopFolders
    let conflictCopies: ConflictCopies
}

extension NodeResolver {
    /// Resolves a kernel node, reading its document's tree first when it is a directory whose
    /// children are asked for.
    func resolve(_ id: NodeID, loadingChildren: Bool = false) throws(Errno) -> ViewNode? {
        let (node, document) = try state.withLock { state throws(Errno) -> (ViewNode?, DocumentState?) in
            let node = try self.node(&state, id)
            return (node, node.flatMap { self.document(&state, of: $0) })
        }
        if loadingChildren, let document { try ensureLoaded(document) }
        if loadingChildren, let node, desktop.isVirtual(node) {
            try desktop.refreshVirtual(node, force: false)
        } else if loadingChildren, let node, node.conflict != nil {
            try conflictCopies.ensureConflictLoaded(node)
        }
        return node
    }
}
