package gem.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system (file://, with its checksums) whose permissions are set through
 * java.nio rather than a child process.
 *
 * <p>Without Hadoop's native library, which pyspark does not ship, RawLocalFileSystem sets the mode
 * of every file and folder it creates by running chmod in a forked process. A Delta write of a
 * range of days creates one Parquet file and one checksum file per day and task, so a 1,000-day
 * import spends most of its writes waiting on those processes (gem.lakehouse.spark's session
 * built with this class starts none). Modes are the same; only the setuid, setgid and
 * sticky bits, which Java cannot set and a lakehouse never uses, are dropped.
 */
public class NioLocalFileSystem extends LocalFileSystem {

  public NioLocalFileSystem() {
    super(new Raw());
  }

  /** RawLocalFileSystem with setPermission through java.nio.file.Files. */
  public static class Raw extends RawLocalFileSystem {
    // Bit i of a Unix mode (others x, w, r, group x, w, r, owner x, w, r).
    private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      int mode = permission.toShort();
      Set<PosixFilePermission> perms = EnumSet.noneOf(PosixFilePermission.class);
      for (int i = 0; i < BITS.length; i++) {
        if ((mode & (1 << i)) != 0) {
          perms.add(BITS[i]);
        }
      }
      Files.setPosixFilePermissions(pathToFile(p).toPath(), perms);
    }
  }
}
