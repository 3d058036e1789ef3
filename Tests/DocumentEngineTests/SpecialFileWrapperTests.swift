import Foundation
import TestSupport
import Testing

@testable import DocumentEngine

#if canImport(Glibc)
    import Glibc
#endif

/// Special files (fifos, sockets, devices): a fourth family of wrapper kinds besides Apple's
/// three, with no contents and no children. They read from disk, write back, serialize, and
/// a device keeps its number.
@Suite struct SpecialFileWrapperTests {
    static let isRoot = geteuid() == 0

    @Test func onlySpecialKindsMakeSpecialWrappers() {
        #expect(FileWrapper(specialFileOfKind: .regularFile) == nil)
        #expect(FileWrapper(specialFileOfKind: .directory) == nil)
        #expect(FileWrapper(specialFileOfKind: .symbolicLink) == nil)
        let fifo = FileWrapper(specialFileOfKind: .fifo, device: 42)
        #expect(fifo?.kind == .fifo && fifo?.isSpecialFile == true)
        // Only devices have a number.
        #expect(fifo?.deviceIdentifier == nil)
        #expect(FileWrapper(specialFileOfKind: .blockDevice, device: 42)?.deviceIdentifier == 42)
    }

    @Test func aFolderOfSpecialFilesReadsAndWritesBack() throws {
        let tmp = try TemporaryDirectory()
        try tmp.write("In/a.txt", "a")
        #expect(mkfifo(tmp.path("In/pipe"), 0o640) == 0)
        #expect(mknod(tmp.path("In/sock"), S_IFSOCK | 0o600, 0) == 0)
        let device = dev_t(deviceNumber(1, 5))
        if Self.isRoot { #expect(mknod(tmp.path("In/zero"), S_IFCHR | 0o666, device) == 0) }

        let folder = try FileWrapper(url: tmp.url("In"), options: .immediate)
        let children = try #require(folder.fileWrappers)
        #expect(children["pipe"]?.kind == .fifo)
        #expect(children["pipe"]?.fileAttributes[.posixPermissions] as? Int == 0o640)
        #expect(children["sock"]?.kind == .socket)
        if Self.isRoot {
            #expect(children["zero"]?.kind == .characterDevice)
            #expect(children["zero"]?.deviceIdentifier == UInt64(device))
        }

        try folder.write(to: tmp.url("Out"), options: [], originalContentsURL: nil)
        var st = stat()
        #expect(lstat(tmp.path("Out/pipe"), &st) == 0 && st.st_mode & S_IFMT == S_IFIFO)
        #expect(st.st_mode & 0o777 == 0o640 & ~POSIX.currentUmask())
        #expect(lstat(tmp.path("Out/sock"), &st) == 0 && st.st_mode & S_IFMT == S_IFSOCK)
        if Self.isRoot {
            #expect(lstat(tmp.path("Out/zero"), &st) == 0 && st.st_mode & S_IFMT == S_IFCHR)
            #expect(st.st_rdev == device)
        }
    }

    @Test func specialFilesSerialize() throws {
        let folder = FileWrapper(directoryWithFileWrappers: [:])
        for (name, kind, device) in [
            ("pipe", FileWrapper.Kind.fifo, UInt64(0)), ("sock", .socket, 0),
            ("tty", .characterDevice, 0x0405),
            ("disk", .blockDevice, 0x0800),
        ] {
            let wrapper = try #require(FileWrapper(specialFileOfKind: kind, device: device))
            wrapper.preferredFilename = name
            folder.addFileWrapper(wrapper)
        }
        let data = try folder.serialized()
        let decoded = try FileWrapper(validatingSerializedRepresentation: data)
        let children = try #require(decoded.fileWrappers)
        #expect(children["pipe"]?.kind == .fifo)
        #expect(children["sock"]?.kind == .socket)
        #expect(children["tty"]?.kind == .characterDevice && children["tty"]?.deviceIdentifier == 0x0405)
        #expect(children["disk"]?.kind == .blockDevice && children["disk"]?.deviceIdentifier == 0x0800)
        #expect(decoded.serializedRepresentation == data)
    }
}
