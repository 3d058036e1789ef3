import FUSE
import SystemPackage

/// The kernel's name requests, answered from ``NameOperations``.
extension DocumentFileSystem {
    public func create(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions,
        flags: OpenFlags, reply: consuming ReplyCreate
    ) {
        do throws(Errno) {
            let (node, handle, attributes) = try names.create(
                context, parent: parent, name: name, permissions: permissions, flags: flags)
            reply.created(
                node.ino, in: table, attributes: attributes, handle: FUSE.FileHandle(handle),
                attributeTimeout: configuration.attributeTimeout, entryTimeout: configuration.entryTimeout)
        } catch { reply.error(error) }
    }

    public func mknod(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, type: FUSE.FileType,
        permissions: FilePermissions, rdev: UInt64, reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            let (node, attributes) = try names.mknod(
                context, parent: parent, name: name, type: type, permissions: permissions, rdev: rdev)
            entry(reply, node, attributes)
        } catch { reply.error(error) }
    }

    public func mkdir(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions,
        reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            let (node, attributes) = try names.mkdir(
                context, parent: parent, name: name, permissions: permissions)
            entry(reply, node, attributes)
        } catch { reply.error(error) }
    }

    public func symlink(
        _ context: RequestContext, target: [UInt8], parent: NodeID, name: FUSE.FileName,
        reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            let (node, attributes) = try names.symlink(context, target: target, parent: parent, name: name)
            entry(reply, node, attributes)
        } catch { reply.error(error) }
    }

    public func link(
        _ context: RequestContext, node: NodeID, newParent: NodeID, newName: FUSE.FileName,
        reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            let (file, attributes) = try names.link(
                context, node: node, newParent: newParent, newName: newName)
            entry(reply, file, attributes)
        } catch { reply.error(error) }
    }

    public func unlink(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            try names.remove(parent: parent, name: name, directory: false)
            reply.ok()
        } catch { reply.error(error) }
    }

    public func rmdir(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            try names.remove(parent: parent, name: name, directory: true)
            reply.ok()
        } catch { reply.error(error) }
    }

    public func rename(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, newParent: NodeID,
        newName: FUSE.FileName, flags: RenameFlags, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            try names.rename(
                context, parent: parent, name: name, newParent: newParent, newName: newName, flags: flags)
            reply.ok()
        } catch { reply.error(error) }
    }
}
